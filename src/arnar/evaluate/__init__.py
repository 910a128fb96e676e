"""Evaluation as a frozen protocol (docs/design.md section 7): ASR, speaker similarity, speed."""
