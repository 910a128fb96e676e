"""arnar: hybrid AR / NAR token-based TTS on one shared stack."""

__version__ = "0.1.0"
