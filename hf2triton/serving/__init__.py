"""The serving code: what runs inside a rendered Triton model (and, in-process, validation's reference).

- model.py: the Triton glue only (`TritonPythonModel`): requests in, the engine, responses out, cancellation.
- interface.py: tensor names, `ModelParameters`, limits -- shared with render, validation and every client.
- inputs.py: a request's inputs decoded and checked (`RequestError`), for every task and engine.
- pooling.py: a sentence-transformers embedder's own description (modules, pooling modes, prompts) and its pooling.
- tasks/: one module per task head, registered in tasks.ENGINES; `engine_from_parameters` chooses the engine.
- runtimes/: one module per backend (pytorch, onnxruntime, tensorrt, vllm) behind `load(spec)`; graphs.py.
- batching/: the torch continuous batcher for streaming generation.

A rendered model gets model.py and only the modules it uses (hf2triton.pipeline.render.serving_files), at the
same paths; they import each other relatively, so this file is not copied and hf2triton need not be installed in
the stub's Python.
"""
