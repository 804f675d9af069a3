"""The shared vocabulary (compatfs.translate): each generic edit, predicate
and the projector builder on its own, and every one of them total: whatever
the type of a value it reads, it gives a verdict or a GGUFError naming the
key, never another exception."""

import math

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from gguf import Keys
from gguf import TokenType as TT

from compatfs import handlers
from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import Value, array, boolean, f32, string, u32
from compatfs.testing.gguf_edit import Blob, payload
from compatfs.translate import (
    ALWAYS,
    BYTE_TOKENS,
    BlockCount,
    CopyIfAbsent,
    Count,
    Default,
    Drop,
    DropPrefix,
    FillArray,
    FromShape,
    Hide,
    KVEdit,
    PadArray,
    PadTokensUnused,
    PerLayerToMax,
    Reciprocal,
    Rename,
    Scaled,
    Set,
    StoredType,
    TensorEdit,
    TokenType,
    Translation,
    TruncateToRows,
    ZeroPerLayer,
    any_of,
    arch_is,
    clip_projector,
    has_true,
    per_layer_mismatch,
    plan,
    str_contains,
    token_is,
    value_at_least,
    value_is,
)

from ggufs import write_gguf

TOKENS, TYPES = Keys.Tokenizer.LIST, Keys.Tokenizer.TOKEN_TYPE


def test_pad_tokens_become_unused_and_named_by_id():
    kv = {TOKENS: array(VT.STRING, ["a", "<|x|>", "[PAD0]", "[PAD1]"]), TYPES: array(VT.INT32, [1, 3, 4, 4])}
    PadTokensUnused().apply(kv, None)
    assert kv[TOKENS].decode() == ["a", "<|x|>", "[PAD2]", "[PAD3]"]
    assert list(kv[TYPES].decode()) == [TT.NORMAL, TT.CONTROL, TT.UNUSED, TT.UNUSED]
    # A vocabulary whose last token only looks like a filler is left alone.
    kv = {TOKENS: array(VT.STRING, ["a", "[PAD1]"]), TYPES: array(VT.INT32, [1, 4])}
    before = dict(kv)
    PadTokensUnused().apply(kv, None)
    assert kv == before


def test_token_types_set_by_text():
    kv = {TOKENS: array(VT.STRING, ["<0x00>", "a", "<0xFF>"]), TYPES: array(VT.INT32, [1, 1, 1])}
    TokenType(BYTE_TOKENS, TT.BYTE).apply(kv, None)
    assert list(kv[TYPES].decode()) == [TT.BYTE, TT.NORMAL, TT.BYTE]
    assert len(BYTE_TOKENS) == 256 and BYTE_TOKENS[0x41] == "<0x41>"


def test_arrays_padded_to_a_length_copied_or_in_place():
    kv = {"s": array(VT.INT32, [2, 1, 1])}
    PadArray("s", "d", 4).apply(kv, None)
    assert list(kv["d"].decode()) == [2, 1, 1, 0] and list(kv["s"].decode()) == [2, 1, 1]
    PadArray("s", "s", 4).apply(kv, None)
    assert list(kv["s"].decode()) == [2, 1, 1, 0]
    # Longer than the length, or the target there already: left alone.
    kv = {"s": array(VT.INT32, [1, 2, 3, 4, 5]), "d": u32(7)}
    before = dict(kv)
    PadArray("s", "d", 4).apply(kv, None)
    PadArray("s", "s", 4).apply(kv, None)
    assert kv == before


def test_per_layer_counts():
    kv = {"h": array(VT.UINT32, [0, 0, 0, 2])}
    PerLayerToMax("h").apply(kv, None)
    assert kv["h"] == u32(2)
    kv = {"h": array(VT.UINT32, [0, 0])}  # no attention layer at all: left alone
    PerLayerToMax("h").apply(kv, None)
    assert kv["h"] == array(VT.UINT32, [0, 0])


def test_per_layer_zeroing_looks_at_the_blocks_the_blob_holds(blob):
    """A per-layer array longer than the blocks the blob holds (its length is
    the header's word) is zeroed where a layer lacks the tensor, and the
    predicate sees it, the layers taken from the tensors held."""
    counts = [3] * 100_000
    blob.kvs[KEY] = array(VT.UINT32, counts)
    try:
        assert per_layer_mismatch(KEY, "blk.{}.attn_q.weight")(blob)
        kv = {KEY: blob.kvs[KEY]}
        ZeroPerLayer(KEY, "blk.{}.attn_q.weight").apply(kv, blob)  # the blob holds blk.0 only
        assert kv[KEY] == array(VT.UINT32, [3] + [0] * (len(counts) - 1))
        blob.kvs[KEY] = kv[KEY]
        assert not per_layer_mismatch(KEY, "blk.{}.attn_q.weight")(blob)
    finally:
        blob.kvs.pop(KEY)


def test_reciprocal_and_scaled_numbers():
    edit = Reciprocal("ratio", "scale")
    for ratio, want in (
        (0.5, 2),
        (0.25, 4),
        (1.0, 1),
        (0.4, None),
        (0.0, None),
        (-0.5, None),
        (math.nan, None),
        (math.inf, None),
    ):
        kv = {"ratio": f32(ratio)}
        edit.apply(kv, None)
        assert kv.get("scale") == (None if want is None else u32(want)), ratio
    kv = {"ratio": array(VT.FLOAT32, [0.5])}
    edit.apply(kv, None)
    assert "scale" not in kv
    kv = {"heads": u32(16)}
    Scaled("heads", "ff", 4).apply(kv, None)
    assert kv["ff"] == u32(64)
    with pytest.raises(GGUFError, match="does not fit"):
        Scaled("heads", "ff", 4).apply({"heads": u32(2**32 - 1)}, None)


def test_rename_into_moves_a_tower_without_chaining():
    from compatfs.translate import ViewTensor
    from gguf import GGMLQuantizationType as DT

    ts = [ViewTensor(n, (4,), DT.F32) for n in ("s.blk.0.norm1.weight", "s.blk.0.mlp.weight", "s.neck.0.weight")]
    for edit in (
        Rename(".norm1", ".pre_ln", under="s.blk.", into="v.sam.blk."),
        Rename("s", "v.sam"),
        Rename("v.sam", "x"),
    ):
        ts = edit.apply(ts, None)
    assert [t.name for t in ts] == ["v.sam.blk.0.pre_ln.weight", "v.sam.blk.0.mlp.weight", "v.sam.neck.0.weight"]


def test_drop_removes_exactly_the_keys_it_names_and_drop_prefix_by_prefix():
    eos, eos_ids = Keys.Tokenizer.EOS_ID, "tokenizer.ggml.eos_token_ids"
    kv = {eos: u32(2), eos_ids: array(VT.INT32, [2, 3]), "x.vision.a": u32(1), "x.visionary": u32(1)}
    Drop((eos, "absent")).apply(kv, None)
    assert list(kv) == [eos_ids, "x.vision.a", "x.visionary"]
    DropPrefix(("x.vision.",)).apply(kv, None)
    assert list(kv) == [eos_ids, "x.visionary"]


def test_a_translation_takes_only_edits_of_the_right_kind():
    with pytest.raises(TypeError, match="not a KV edit"):
        Translation("t", ALWAYS, kv=(Hide(("v.",)),))
    with pytest.raises(TypeError, match="not a tensor edit"):
        Translation("t", ALWAYS, tensors=(Drop(("a.",)),))

    class Duck:  # an `apply(kv, src)` that is no KVEdit is refused too
        def apply(self, kv, src):
            pass

    with pytest.raises(TypeError, match="not a KV edit"):
        Translation("t", ALWAYS, kv=(Duck(),))
    with pytest.raises(TypeError, match="StoredType"):
        Translation("t", ALWAYS, stored_types=(StoredType(0, 32, 18),))  # F32 is no unknown type
    for tr in (*handlers.TEXT, *handlers.CLIP):
        assert all(isinstance(e, KVEdit) for e in tr.kv) and all(isinstance(e, TensorEdit) for e in tr.tensors)


def test_clip_projector_builder():
    tr = clip_projector(
        "x-clip",
        arch_is("x"),
        "x",
        "mlp",
        copy=("block_count",),
        edits=(Default("clip.vision.image_size", u32(224)),),
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        keep_present=True,
    )
    kv = {
        "general.architecture": string("x"),
        "x.vision.block_count": u32(2),
        "x.embedding_length": u32(64),
        "x.other": u32(1),
        "tokenizer.ggml.model": string("llama"),
        "clip.use_gelu": boolean(False),
    }
    for edit in tr.kv:
        edit.apply(kv, None)
    assert kv == {
        "general.architecture": string("clip"),
        "clip.use_gelu": boolean(False),
        "clip.vision.block_count": u32(2),
        "clip.vision.projection_dim": u32(64),
        "clip.vision.image_size": u32(224),
        "clip.vision.image_mean": array(VT.FLOAT32, [0.5] * 3),
        "clip.vision.image_std": array(VT.FLOAT32, [0.5] * 3),
        "clip.has_vision_encoder": boolean(True),
        "clip.projector_type": string("mlp"),
        "general.type": string("mmproj"),
    }
    assert list(kv)[-3:] == ["clip.has_vision_encoder", "clip.projector_type", "general.type"]


# -- totality --------------------------------------------------------------------------


def _hostile_values() -> dict[str, Value]:
    """A value of every kind a header can hold."""
    nested = Value(VT.ARRAY, payload(VT.ARRAY, (VT.ARRAY, [(VT.INT32, [1, 2])])))
    return {
        "string": string("x"),
        "empty string": string(""),
        "bool": boolean(True),
        "u32 max": u32(2**32 - 1),
        "u64 huge": Value(VT.UINT64, (2**64 - 1).to_bytes(8, "little")),
        "nan": f32(math.nan),
        "inf": f32(math.inf),
        "i32 negative": Value(VT.INT32, (-5).to_bytes(4, "little", signed=True)),
        "empty array": array(VT.INT32, []),
        "strings": array(VT.STRING, ["a", "b"]),
        "floats with nan": array(VT.FLOAT32, [1.0, math.nan, math.inf]),
        "bools": array(VT.BOOL, [True, False]),
        "nested": nested,
        "u64 array": array(VT.UINT64, [2**64 - 1, 0]),
    }


KEY = "k"
EDITS = [
    CopyIfAbsent(KEY, "d"),
    Default(KEY, u32(1)),
    Set("d", u32(1), when=value_is(KEY, 1)),
    BlockCount(KEY, "blk."),
    ZeroPerLayer(KEY, "blk.{}.attn_q.weight"),
    PerLayerToMax(KEY),
    PadArray(KEY, "d", 4),
    PadArray(KEY, KEY, 4),
    Reciprocal(KEY, "d"),
    Scaled(KEY, "d", 4),
    FromShape(KEY, "t", axis=1),
    TruncateToRows("t", (KEY,)),
    FillArray(KEY, -1000.0),
]
TOKEN_EDITS = [TokenType(("a",), TT.CONTROL), PadTokensUnused()]
PREDS = [
    value_is(KEY, "x"),
    value_is(KEY, 1),
    value_at_least(KEY, 1),
    has_true(KEY),
    str_contains(KEY, "x"),
    per_layer_mismatch(KEY, "blk.{}.attn_q.weight"),
    arch_is("x"),
    token_is(0, "a"),
    any_of(value_is(KEY, "x"), ~has_true(KEY)),
]


@pytest.fixture(scope="module")
def blob(tmp_path_factory) -> SourceGGUF:
    path = write_gguf(
        tmp_path_factory.mktemp("vocab") / "t.gguf",
        "x",
        {},
        {"t": np.zeros((2, 3), np.float32), "blk.0.attn_q.weight": np.zeros(4, np.float32)},
    )
    return SourceGGUF(path)


@pytest.mark.parametrize("kind", sorted(_hostile_values()))
def test_every_edit_and_predicate_is_total(blob, kind):
    value = _hostile_values()[kind]
    for edit in EDITS:
        kv = {KEY: value}
        try:
            edit.apply(kv, blob)
        except GGUFError as e:
            assert KEY in str(e) or "fit" in str(e), (edit, str(e))
    for edit in TOKEN_EDITS:
        for kv in ({TOKENS: array(VT.STRING, ["a", "[PAD0]"]), TYPES: value}, {TOKENS: value, TYPES: value}):
            try:
                edit.apply(kv, blob)
            except GGUFError as e:
                assert TYPES in str(e), (edit, str(e))
    for pred in PREDS:
        blob.kvs[KEY] = blob.kvs[Keys.General.ARCHITECTURE] = blob.kvs[TOKENS] = value
        try:
            assert pred(blob) in (True, False)
        finally:
            for k in (KEY, TOKENS):
                blob.kvs.pop(k)
            blob.kvs[Keys.General.ARCHITECTURE] = string("x")


@pytest.mark.parametrize("kind", sorted(_hostile_values()))
def test_counts_name_the_key_whatever_its_type(blob, kind):
    blob.kvs["x.block_count"] = _hostile_values()[kind]
    try:
        Count("x.block_count", "blk.").check(blob)
    except GGUFError as e:
        assert "x.block_count is " in str(e) and len(str(e)) < 200
    finally:
        del blob.kvs["x.block_count"]


def test_a_stored_type_is_range_checked(tmp_path):
    """Two tensors of a type only a translation knows (gpt-oss's type 4) at
    one offset: the overlap refuses the view, as for any other type."""
    w = Blob.parse(
        write_gguf(
            tmp_path / "a.gguf", "x", {}, {"a": np.zeros(16, np.float32), "b": np.zeros(16, np.float32)}
        ).read_bytes()
    )
    for t in w.tensors:
        t.dims, t.ggml_type = (32,), 4
    tr = Translation("t", ALWAYS, stored_types=(StoredType(4, 32, 17),), tensors=(Hide(("a", "b")),))
    apart = tmp_path / "apart.gguf"
    apart.write_bytes(w.serialize())
    plan(tr, SourceGGUF(apart))
    w.tensors[1].offset = w.tensors[0].offset
    same = tmp_path / "same.gguf"
    same.write_bytes(w.serialize())
    with pytest.raises(GGUFError, match="overlaps"):
        plan(tr, SourceGGUF(same))


# -- tensor makers and the detectors of tensors ---------------------------------------


class FakeBlob:
    """Just what makers and detectors read: KVs and tensor infos."""

    def __init__(self, kvs: dict, tensors: dict):
        from compatfs.format.header import TensorInfo

        self.kvs = kvs
        self.tensors = {
            n: TensorInfo(n, shape, dtype, 4096 * i) for i, (n, (shape, dtype)) in enumerate(tensors.items())
        }

    def has_tensor_prefix(self, prefix):
        return any(n.startswith(prefix) for n in self.tensors)

    def block_ids(self, prefix):
        return frozenset(int(n[len(prefix) :].split(".")[0]) for n in self.tensors if n.startswith(prefix))


def test_parts_concatenated_per_block_in_f32_where_dtypes_differ():
    from gguf import GGMLQuantizationType as DT
    from compatfs.translate import concatenated, split_qkv

    parts = split_qkv("weight")
    assert parts == ("v.blk.{}.attn_q.weight", "v.blk.{}.attn_k.weight", "v.blk.{}.attn_v.weight")
    same = {p.format(0): ((64, 64), DT.F16) for p in parts}
    mixed = {**same, "v.blk.0.attn_v.weight": ((64, 64), DT.Q8_0)}
    assert concatenated(*parts)(FakeBlob({}, same), 0).dtype == DT.F16
    op = concatenated(*parts)(FakeBlob({}, mixed), 0)
    assert op.dtype == DT.F32 and op.shape == (64, 192)
    assert concatenated(*parts)(FakeBlob({}, same), 1) is None
    for odd in (((64, 32), DT.F16), ((), DT.F16), ((64, 64), 4)):
        with pytest.raises(GGUFError, match="cannot merge"):
            concatenated(*parts)(FakeBlob({}, {**same, "v.blk.0.attn_k.weight": odd}), 0)


def test_tensors_stacked_along_a_new_axis():
    from gguf import GGMLQuantizationType as DT
    from compatfs.format.header import TensorInfo
    from compatfs.translate import stacked

    experts = [TensorInfo(f"e{i}", (64, 32), DT.BF16, 100 * i) for i in range(3)]
    op = stacked(experts)
    assert op.shape == (64, 32, 3) and op.dtype == DT.BF16
    assert stacked([*experts[:2], TensorInfo("q", (64, 32), DT.Q8_0, 0)]).dtype == DT.F32
    with pytest.raises(GGUFError, match="e0"):
        stacked([experts[0], TensorInfo("odd", (64, 16), DT.BF16, 0)])


def test_an_embedding_row_by_its_token():
    from gguf import GGMLQuantizationType as DT
    from compatfs.translate import embedding_row

    blob = FakeBlob({TOKENS: array(VT.STRING, ["a", "[IMG_BREAK]", "c"])}, {"token_embd.weight": ((64, 3), DT.Q8_0)})
    op = embedding_row("[IMG_BREAK]")(blob)
    row = 64 // 32 * 34  # two Q8_0 blocks
    assert op.shape == (64,) and op.dtype == DT.F32 and op.inputs[0].offset == row
    assert embedding_row("absent")(blob) is None
    blob.tensors["token_embd.weight"] = type(blob.tensors["token_embd.weight"])("token_embd.weight", (64,), DT.F32, 0)
    assert embedding_row("[IMG_BREAK]")(blob) is None  # 1-d: no rows to take


def test_tensor_detectors():
    from gguf import GGMLQuantizationType as DT
    from compatfs.translate import BlockCount, has_block_tensor, has_tensor_ending, has_token, is_array, rows_differ

    blob = FakeBlob(
        {TOKENS: array(VT.STRING, ["a", "<b>"]), "n": u32(2), "l": array(VT.INT32, [1])},
        {
            "x.weight": ((4, 3), DT.F32),
            "y.weight": ((4, 5), DT.F32),
            "blk.3.ffn_latent_in.weight": ((4,), DT.F32),
            "v.blk.0.a": ((4,), DT.F32),
            "v.blk.2.a": ((4,), DT.F32),
        },
    )
    assert rows_differ("x.weight", "y.weight")(blob) and not rows_differ("x.weight", "x.weight")(blob)
    assert not rows_differ("x.weight", "blk.3.ffn_latent_in.weight")(blob)
    assert has_block_tensor("ffn_latent_in")(blob) and not has_block_tensor("ffn_latent_out")(blob)
    assert has_tensor_ending(".ffn_latent_in.weight")(blob) and not has_tensor_ending(".bias")(blob)
    assert has_token("<b>")(blob) and not has_token("<c>")(blob)
    assert is_array("l")(blob) and not is_array("n")(blob) and not is_array("absent")(blob)
    kv = {}
    BlockCount("k", "v.blk.").apply(kv, blob)
    assert kv["k"] == u32(2)


def test_rope_permute_is_llama_cpps_row_order():
    """Against llama.cpp's converter's permutation, written out here with numpy."""
    from gguf import GGMLQuantizationType as DT
    from compatfs.format.header import TensorInfo
    from compatfs.translate import RopePermute, ViewTensor

    hf = np.arange(8 * 3, dtype="<f4").reshape(8, 3)  # HF [rows, cols] = ggml (3, 8)
    name = "v.blk.0.attn_q.weight"
    ts = [ViewTensor(name, (3, 8), DT.F32, source=TensorInfo(name, (3, 8), DT.F32, 0))]
    ts = RopePermute("v.blk.", (".attn_q.weight",), "heads").apply(ts, FakeBlob({"heads": u32(2)}, {}))
    got = np.frombuffer(ts[0].op.compute(lambda _: memoryview(hf.tobytes())), "<f4").reshape(8, 3)
    np.testing.assert_array_equal(got, hf.reshape(2, 2, 2, 3).swapaxes(1, 2).reshape(8, 3))
    for heads in (string("2"), u32(0), u32(3)):
        ts = [ViewTensor(name, (3, 8), DT.F32, source=TensorInfo(name, (3, 8), DT.F32, 0))]
        with pytest.raises(GGUFError, match="cannot rope-permute"):
            RopePermute("v.blk.", (".attn_q.weight",), "heads").apply(ts, FakeBlob({"heads": heads}, {}))
