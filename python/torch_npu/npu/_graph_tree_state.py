"""State shared by ``torch.compiler.npugraph_mark_step_begin`` and NPU graph trees, kept apart so
that marking a step does not import the graph trees (nor Inductor)."""


class MarkStepBox:
    """Counts the user's step marks, downwards, so that they never equal a Dynamo generation."""
    mark_step_counter = 0


def mark_step_begin() -> None:
    """Mark that a new iteration of inference or training begins: outputs of the NPU graphs of
    the previous iteration may be overwritten from now on."""
    MarkStepBox.mark_step_counter -= 1
