"""Decoding building blocks shared by the paradigms: sampling and mask/step schedules."""

from arnar.decode.sampling import restrict_logits, sample_tokens
from arnar.decode.schedules import cosine_mask_ratio, masks_per_step, total_frames_estimate

__all__ = ["cosine_mask_ratio", "masks_per_step", "restrict_logits", "sample_tokens", "total_frames_estimate"]
