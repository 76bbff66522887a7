"""Test bases for npu versions of torch's internal distributed tests (as torch_npu.testing._internal)."""
