# Saved model -> ONNX (optimum; fused and/or int8 as configured) -> TensorRT engine. Only for models whose
# backend needs them: the repository rule asks for these outputs (see repository_inputs).
rule export_onnx:
    input:
        pretrained=rules.pretrained.output[0],
    output:
        directory(f"{WORK}/models/{{model}}/onnx"),
    params:
        task=model_value("task"),
        opset=onnx_value("opset"),
        optimize=onnx_value("optimize"),
        quantize=onnx_value("quantize"),
        exporter=EXPORT_VERSION,
    log:
        "results/logs/export_onnx/{model}.log",
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/export_onnx.py"


rule tensorrt_engine:
    input:
        onnx=rules.export_onnx.output[0],
    output:
        f"{WORK}/models/{{model}}/tensorrt/engine.plan",
    params:
        max_batch_size=model_value("max_batch_size"),
        gpu=GPU_AVAILABLE,
    log:
        "results/logs/tensorrt_engine/{model}.log",
    resources:
        gpu=1,
    conda:
        "../envs/hf2triton.yaml"
    script:
        "../scripts/tensorrt_engine.py"
