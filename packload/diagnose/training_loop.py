"""What ``tune`` and ``doctor`` assume of the training step they measure a loader against, when not told,
and how both say it: one default step time and one loop model, so that the two tools agree.

The step: ``DEFAULT_STEP_MS`` of GPU time per batch (``packload.watch(loader)`` measures the real one
in the user's own loop; give it as ``step_ms``).

The loop: one that waits for each step before it asks for the next batch (``loss.item()`` every
step, as the PyTorch tutorial's loop does). Chosen as the default because a setting found for it
holds for a loop that overlaps steps as well, while one found for an overlapping loop may starve a
waiting one: loading in the main process (``num_workers=0``) adds to every step of a waiting loop,
whereas a DataLoader's workers load the next batches while the step runs in either loop.
"""

from __future__ import annotations

DEFAULT_STEP_MS = 100.0
DEFAULT_SYNC = True  # a loop that waits for each step
HOW_TO_MEASURE = "measure yours with packload.watch(loader) and give it as step_ms"


def resolve_step(step_ms: float | None, model: str | None) -> tuple[float | None, bool]:
    """(the step time to measure against, whether the user gave it): ``DEFAULT_STEP_MS`` when
    neither a step time nor a model is given."""
    if step_ms is None and model is None:
        return DEFAULT_STEP_MS, False
    return step_ms, True


def loop_words(sync: bool) -> str:
    """The loop model, as both verdicts say it."""
    if sync:
        return "a training loop that waits for each step (as loss.item() every step does)"
    return "a training loop that never waits for the step (the next batch is loaded while it runs)"


def assumed(step_ms: float | None, given: bool, model: str | None, batch_size: int, sync: bool,
            emulated: str = "") -> str:
    """The sentence both verdicts carry: the step measured against (``model`` or ``step_ms``, said to
    be the default when not ``given``, with ``emulated`` saying how it was stood in for) and the loop."""
    if model is not None:
        step = f"measured against {model} on the GPU, batches of {batch_size}"
    else:
        how = "as given" if given else f"the default: {HOW_TO_MEASURE}"
        step = f"assumed a GPU step of {step_ms:g} ms per batch of {batch_size} ({how}{emulated})"
    return f"{step}, in {loop_words(sync)}"
