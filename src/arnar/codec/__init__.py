"""Speech codecs (S3Tokenizer v2, DAC, the pipeline's offline codec) behind one interface,
token storage per split, and Chain-of-Details temporal levels; see :mod:`arnar.codec.base`.

The codec backends import their packages (torch, s3tokenizer, dac) only when loaded, so
importing this package is cheap.
"""

from arnar.codec.base import (
    CODECS,
    Codec,
    CodecError,
    CodecUnavailableError,
    codec_info,
    encode_files,
    load_codec,
    register_codec,
)
from arnar.codec.hierarchy import decimate, level_factors, level_lengths, level_rates, levels, upsample
from arnar.codec.shards import StaleTokensError, TokenShardError, read_token_manifest, read_token_shards, write_token_shards

__all__ = [
    "CODECS",
    "Codec",
    "CodecError",
    "CodecUnavailableError",
    "StaleTokensError",
    "TokenShardError",
    "codec_info",
    "decimate",
    "encode_files",
    "level_factors",
    "level_lengths",
    "level_rates",
    "levels",
    "load_codec",
    "read_token_manifest",
    "read_token_shards",
    "register_codec",
    "upsample",
    "write_token_shards",
]
