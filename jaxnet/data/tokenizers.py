"""GPT-2's tokenizer under its former name: :mod:`jaxnet.tokenizers.gpt2` (every tokenizer now
lives in :mod:`jaxnet.tokenizers`).

>>> encode("Hello world")
[15496, 995]
"""

from jaxnet.tokenizers.gpt2 import (  # noqa: F401
    EOT,
    EOT_ID,
    FILE_SHA256,
    INSTALL,
    VOCAB_SIZE,
    decode,
    encode,
    file_hashes,
    gpt2_encoding,
    gpt2_files,
    gpt2_vocab,
)
