"""Evaluation as a frozen protocol (DESIGN.md section 7): ASR, speaker similarity, speed."""
