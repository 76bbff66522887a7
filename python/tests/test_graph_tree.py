"""torch_npu.npu._graph_tree: NPU graph trees (warm-up, recording, replay, tree paths, liveness)
and the torch_npu._C helpers they use."""
import pytest
import torch

import torch_npu
from torch_npu.npu import _graph_tree as gt


@pytest.fixture(autouse=True)
def fresh_trees():
    gt.reset_npugraph_trees()
    yield
    gt.reset_npugraph_trees()


W = None


def _linear(inputs):
    (x,) = inputs
    inputs.clear()  # boxed: the callee owns the list
    return [torch.relu(x @ W) + 1]


def _double(inputs):
    (y,) = inputs
    inputs.clear()
    return [y * 2]


def _compile(fn, example):
    return gt.npugraphify_impl(fn, [example], (), device_index=0, is_backward=False, is_inference=True)


def test_warmup_record_replay_and_child():
    global W
    W = torch.randn(4, 4, device="npu")
    x = torch.randn(3, 4, device="npu")
    f1, f2 = _compile(_linear, x), _compile(_double, x)
    manager = gt.get_manager(0)
    states = []
    for _ in range(4):
        gt.mark_step_begin()
        x = torch.randn(3, 4, device="npu")
        (y,) = f1([x.clone()])
        (z,) = f2([y])
        assert torch.allclose(z, (torch.relu(x @ W) + 1) * 2)
        states.append(manager.path_state)
    assert states == [gt.ExecutionState.WARMUP, gt.ExecutionState.RECORDING,
                      gt.ExecutionState.EXECUTION, gt.ExecutionState.EXECUTION]
    roots = list(manager.get_roots())
    assert len(roots) == 1 and roots[0].num_descendants() == 1  # f2 recorded as f1's child
    # Replays return outputs over the recorded memory.
    assert y.untyped_storage().data_ptr() in roots[0].pinned_storages


def test_replay_output_liveness_and_pinned_discount():
    global W
    W = torch.randn(4, 4, device="npu")
    x = torch.randn(2, 4, device="npu")
    f = _compile(_linear, x)
    for _ in range(3):
        gt.mark_step_begin()
        (out,) = f([x.clone()])
    node = gt.get_manager(0).current_node
    assert isinstance(node, gt.NPUGraphNode)
    ref = node.outputs_weakrefs[0]
    assert gt.is_live(ref)          # the caller holds the output
    view = out[0]
    del out
    assert gt.is_live(ref)          # a view still uses the storage
    del view
    assert not gt.is_live(ref)      # only the tree's own references are left
    assert node.all_outputs_are_dead()


def test_storage_weakref_wrapper_owned_refs():
    t = torch.ones(2, device="npu")
    pin = t.untyped_storage()
    w = gt.StorageWeakRefWrapper(t, owned_refs=1)
    assert not w.expired()
    del t
    assert w.expired() and w() is None  # the pin alone does not keep it alive
    assert w.data_ptr() == pin.data_ptr()
    with pytest.raises(RuntimeError, match="expected a Tensor or an UntypedStorage"):
        gt.StorageWeakRefWrapper([1])


def test_check_memory_pool_counts_graph_blocks():
    global W
    W = torch.randn(4, 4, device="npu")
    x = torch.randn(2, 4, device="npu")
    f = _compile(_linear, x)
    gt.mark_step_begin()
    f([x.clone()])
    gt.mark_step_begin()
    (out,) = f([x.clone()])  # recorded
    manager = gt.get_manager(0)
    node = manager.current_node
    pool = manager.npu_graphs_thread_pool
    assert node.graph_blocks and set(node.graph_blocks) <= set(gt.get_block_addrs(pool))
    gt.check_memory_pool(0, pool, list(node.path_live_weakrefs()))  # consistent: no error
    with pytest.raises(RuntimeError, match="StorageWeakRefWrapper"):
        gt.check_memory_pool(0, pool, [1])


def test_npugraphify_modes_and_errors():
    with pytest.raises(RuntimeError, match="is_backward and is_inference"):
        gt.npugraphify(lambda i: [], [], (), device_index=0, is_backward=True, is_inference=True)
    with pytest.raises(RuntimeError, match="'index' must be a tuple"):
        gt.AliasesPriorGraphOutput(3)
    with pytest.raises(RuntimeError, match="'index' must be an int"):
        gt.AliasesNewOutput("0")


def test_mark_step_and_generation():
    from torch_npu.npu._graph_tree_state import MarkStepBox, mark_step_begin

    before = MarkStepBox.mark_step_counter
    mark_step_begin()
    assert MarkStepBox.mark_step_counter == before - 1
    assert gt.NPUGraphTreeManager.get_curr_generation() == before - 1
    assert gt.NPUGraphTreeManager.user_invoked_mark_step()
    gt.reset_npugraph_trees()
    assert MarkStepBox.mark_step_counter == 0
    # the public form, which torch_npu installs on torch.compiler at import
    import inspect

    assert str(inspect.signature(torch.compiler.npugraph_mark_step_begin)) == "()"
    torch.compiler.npugraph_mark_step_begin()
    assert MarkStepBox.mark_step_counter == -1 and gt.NPUGraphTreeManager.user_invoked_mark_step()
    gt.reset_npugraph_trees()


def test_c_helpers():
    C = torch_npu._C
    x = torch.arange(6.0, device="npu")
    assert C._tensors_data_ptrs_at_indices_equal([x, None], [x.data_ptr(), 0], [0])
    assert not C._tensors_data_ptrs_at_indices_equal([x, None], [x.data_ptr(), 0], [0, 1])
    meta = {"size": (2, 2), "stride": (2, 1), "dtype": torch.float32, "device": x.device, "storage_offset": 2}
    t = C._construct_NPU_Tensor_From_Storage_And_Metadata(meta, x.untyped_storage())
    assert t.tolist() == [[2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(KeyError, match="'metadata' has no 'dtype'"):
        C._construct_NPU_Tensor_From_Storage_And_Metadata({"size": (1,), "stride": (1,)}, x.untyped_storage())
    pool = torch.npu.graph_pool_handle()
    g, s = torch.npu.NPUGraph(), torch.npu.Stream()
    with torch.npu.graph(g, pool=pool, stream=s):
        y = x * 2
    state = C._npu_getCheckpointState(0, pool)
    assert isinstance(state, C._npu_NPUAllocator_AllocatorState)
    assert y.untyped_storage().data_ptr() in state.allocated_addresses()
    assert C._npu_checkPoolLiveAllocations("npu:0", pool, state.allocated_addresses())
    assert not C._npu_checkPoolLiveAllocations(0, pool, set())
    with pytest.raises(ValueError, match="expected an npu device"):
        C._npu_getCheckpointState("cpu", pool)
