# Saved model -> ONNX (optimum, or ONNX Runtime GenAI's builder for decoders; fused and/or int8 as configured)
# -> TensorRT engine. Only for models whose backend needs them: the repository rule asks for these outputs
# (see repository_inputs).
rule export_onnx:
    input:
        pretrained=rules.pretrained.output[0],
    output:
        directory(onnx_dir()),
    params:
        task=model_value("task"),
        opset=onnx_value("opset"),
        exporter=onnx_value("exporter"),
        optimize=onnx_value("optimize"),
        quantize=onnx_value("quantize"),
        precision=export_precision,
        export_version=EXPORT_VERSION,
    log:
        logs("export_onnx"),
    threads: 4
    # What an executor books per job (see rule fetch): the model, its traced graph and the optimized copy.
    resources:
        mem_mb=16000,
        runtime=120,
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/export_onnx.py"


# An engine is valid for one TensorRT version and one GPU: both are params, so a change rebuilds it.
rule tensorrt_engine:
    input:
        onnx=rules.export_onnx.output[0],
    output:
        engine=trt_engine(),
        record=trt_record(),
    params:
        max_batch_size=model_value("max_batch_size"),
        gpu=GPU_AVAILABLE,
        tensorrt=tensorrt_version(),
        gpu_name=GPU_NAME,
    log:
        logs("tensorrt_engine"),
    threads: 4
    # What an executor books per job (see rule fetch); gpu=1 becomes sbatch --gpus=1 under the SLURM
    # executor (its type: --set-resources tensorrt_engine:gpu_model=h100; anything else: slurm_extra).
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=1,
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/tensorrt_engine.py"
