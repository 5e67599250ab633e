"""Benchmarks: `python -m minigate.bench {model,train}`; each reports ratios measured side by side."""
