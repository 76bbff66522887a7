"""Test utilities compatible with Huawei's ``torch_npu.testing``.

* :mod:`.testcase`: ``TestCase`` (``assertRtolEqual``, device-tolerant ``assertEqual``), ``run_tests``
* :mod:`.common_utils`: ``create_common_tensor``, ``SupportedDevices``, ...
* :mod:`.decorator`: ``Dtypes``, ``Formats``, ``instantiate_tests``
* :mod:`.common_distributed`: ``with_comms``, ``skipIfUnsupportMultiNPU``

The submodules are built on ``torch.testing._internal`` and imported on demand.
"""
