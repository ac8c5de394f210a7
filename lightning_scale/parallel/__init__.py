"""The engines under the strategies, one package each (no Lightning imports): ``data`` (gradient compression,
ZeRO-1/2) for ``data_parallel``, ``model`` (FSDP2 units, the tensor-parallel plan) for ``model_parallel``, ``pipeline``
(schedules, stage split, step runner) for ``pipeline_parallel``."""
