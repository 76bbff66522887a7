"""A Dynamo guard on torch_npu's deterministic level (``torch.npu.set_deterministic_level``).

Dynamo already guards ``torch.are_deterministic_algorithms_enabled()``, which tells level 0
from levels 1 and 2 but not level 1 from 2 (deterministic collectives too). A graph compiled
at one level must not run at another, so a compiler installs this guard while it compiles:
a change of level then recompiles.
"""
__all__ = ["install_npu_deterministic_level_guard"]


def install_npu_deterministic_level_guard() -> bool:
    """Adds the guard to the frame being compiled; False outside a Dynamo compilation."""
    from torch._dynamo.guards import get_verbose_code_parts
    from torch._dynamo.source import GlobalStateSource
    from torch._guards import TracingContext

    import torch_npu

    context = TracingContext.try_get()
    if context is None:
        return False
    level = torch_npu.npu._get_deterministic_level()

    def create_guard(builder, guard):
        builder.guard_manager.root.add_lambda_guard(
            lambda _: torch_npu.npu._get_deterministic_level() == level,
            get_verbose_code_parts([f"torch_npu.npu._get_deterministic_level() == {level}"], guard),
            guard.user_stack,
        )

    context.guards_context.dynamo_guards.add(GlobalStateSource().make_guard(create_guard))
    return True
