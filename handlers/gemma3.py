"""Gemma 3 as Ollama published it: text view and the clip view of monolithic
vision blobs.

Older Ollama converters wrote nested rope keys, left out the RMS-norm epsilon
and rope scaling, kept multimodal tokens past the embedding rows, and stored
the SigLIP tower and projector (`v.*`, `mm.*`) in the same file under their
own names.
"""

from gguf import MODEL_TENSOR as T
from gguf import Keys
from gguf import TokenType as TT

from compatfs.format.values import boolean, f32, string
from compatfs.translate import (
    ArchKeys,
    CopyIfAbsent,
    Default,
    Hide,
    Rename,
    ToF32,
    TokenType,
    Translation,
    TruncateToRows,
    When,
    any_of,
    arch_is,
    base,
    clip_projector,
    has_key,
    has_tensor,
    has_tensor_prefix,
    leaf,
    tensor,
    value_at_least,
)

# Google's published Gemma 3 chat template (Ollama files carry none).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

K = ArchKeys("gemma3")

# Any one of these marks a gemma3 blob as Ollama-written.  Blobs with
# `dense.0.weight` are EmbeddingGemma, which is a different translation.
DETECT = (
    arch_is("gemma3")
    & ~has_tensor("dense.0.weight")
    & any_of(
        has_key("gemma3.mm.tokens_per_image"),
        has_tensor_prefix("v."),
        has_tensor_prefix("mm."),
        has_key("gemma3.rope.global.freq_base"),
        has_key("gemma3.rope.local.freq_base"),
        has_key("tokenizer.ggml.add_padding_token"),
        has_key("tokenizer.ggml.add_unknown_token"),
        ~has_key(K.Attention.LAYERNORM_RMS_EPS),
    )
)

TEXT = Translation(
    name="gemma3",
    detect=DETECT,
    kv=(
        CopyIfAbsent("gemma3.rope.global.freq_base", K.Rope.FREQ_BASE),
        CopyIfAbsent("gemma3.rope.local.freq_base", K.Rope.FREQ_BASE_SWA),
        Default(K.Attention.LAYERNORM_RMS_EPS, f32(1e-6)),
        Default(K.Rope.FREQ_BASE, f32(1_000_000.0)),
        Default(K.Rope.FREQ_BASE_SWA, f32(10_000.0)),
        Default(Keys.Tokenizer.CHAT_TEMPLATE, string(CHAT_TEMPLATE)),
        # 4B/12B/27B extend a 16k training context 8x by linear rope scaling.
        When(
            value_at_least(K.LLM.CONTEXT_LENGTH, 131072),
            (Default(K.Rope.SCALING_TYPE, string("linear")), Default(K.Rope.SCALING_FACTOR, f32(8.0))),
        ),
        # Extra multimodal tokens past the embedding rows fail the vocab check.
        TruncateToRows("token_embd.weight", (Keys.Tokenizer.LIST, Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE)),
        # Gemma's SentencePiece model adds no dummy prefix; without the key
        # llama.cpp prepends a space and tokenizes differently.
        Default(Keys.Tokenizer.ADD_PREFIX, boolean(False)),
        # Ollama typed the image markers as ordinary text, so llama.cpp would
        # split "<start_of_image>" into pieces instead of matching the token.
        TokenType(("<start_of_image>", "<end_of_image>"), TT.CONTROL),
    ),
    tensors=(Hide(("v.", "mm.")),),
)

CLIP = clip_projector(
    "gemma3-clip",
    DETECT & has_tensor_prefix("v."),
    "gemma3",
    "gemma3",
    copy=(
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "image_size",
        "patch_size",
        "attention.head_count",
        "attention.layer_norm_epsilon",
    ),
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    keep_present=True,
    tensors=(
        Rename("v.patch_embedding", base(T.V_ENC_EMBD_PATCH)),
        Rename("v.position_embedding", base(T.V_ENC_EMBD_POS)),
        Rename("v.post_layernorm", base(T.V_POST_NORM)),
        Rename(".layer_norm1", leaf(T.V_ENC_INPUT_NORM)),
        Rename(".layer_norm2", leaf(T.V_ENC_POST_ATTN_NORM)),
        Rename(".attn_output", leaf(T.V_ENC_ATTN_O)),
        # SigLIP fc1 widens (n_embd -> n_ff), fc2 narrows: llama.cpp's
        # converter names them ffn_up and ffn_down.
        Rename(".mlp.fc1", leaf(T.V_ENC_FFN_UP)),
        Rename(".mlp.fc2", leaf(T.V_ENC_FFN_DOWN)),
        Rename("mm.mm_input_projection", base(T.V_MM_INP_PROJ)),
        Rename("mm.mm_soft_emb_norm", base(T.V_MM_SOFT_EMB_NORM)),
        # llama.cpp keeps the patch and position embeddings in F32.
        ToF32((tensor(T.V_ENC_EMBD_PATCH), tensor(T.V_ENC_EMBD_POS))),
    ),
)
