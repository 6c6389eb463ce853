"""What an endpoint picker scrapes (the Gateway API Inference Extension's model server protocol): queue and
running gauges, KV use under both of vLLM's names, vllm:lora_requests_info, and vllm:cache_config_info with
the block size and block count its prefix-cache scorer sizes itself by."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def test_endpoint_picker_metrics(http, server):
    text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info"):
        assert families[name].type == "gauge", name
    usage = families["vllm:kv_cache_usage_perc"].samples[0].value
    assert 0 <= usage <= 1 and families["vllm:gpu_cache_usage_perc"].samples[0].value == usage
    (lora,) = families["vllm:lora_requests_info"].samples
    assert lora.labels == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert lora.value > 1e9  # a Unix time: the picker keeps the latest series
    (config,) = families["vllm:cache_config_info"].samples
    cfg = server.engine.config
    assert config.labels["block_size"] == str(cfg.block_size)
    assert config.labels["num_gpu_blocks"] == str(cfg.num_blocks)
