"""pd-accuracy: accuracy regression harness for vLLM prefill/decode disaggregation."""
__version__ = "0.1.0"
