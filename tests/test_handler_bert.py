"""Snowflake Arctic Embed 2 as Ollama published it (`bert`, tokenizer `t5`,
the normalization table as base64 characters; no genuine fixture, the
legacy writer's model): through the mount the table is bytes again, and the
model loads, normalizes and embeds; untranslated llama.cpp refuses it."""

import base64

import numpy as np
import pytest

from compatfs.format.header import SourceGGUF
from compatfs.format.values import VT, array
from compatfs.handlers import bert
from compatfs.testing.bert import NORMALIZE, legacy_snowflake_arctic_embed2, precompiled_charsmap
from compatfs.testing.store import add_model

from compare import kvs
from conftest import needs_fuse
from xlc_client import run_job

ASCII = "HELLO world! hello"
FULLWIDTH = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in ASCII).replace(" ", "\u00a0", 1)


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return legacy_snowflake_arctic_embed2(tmp_path_factory.mktemp("snowflake") / "snowflake.gguf")


@needs_fuse
def test_loads_normalizes_and_embeds_through_the_mount(blob, tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "snowflake-arctic-embed2", blob, tag="568m")
    mounted = mount_store(store) / "snowflake-arctic-embed2:568m/model.gguf"

    raw, got = kvs(blob), kvs(mounted)
    table = precompiled_charsmap(NORMALIZE)
    assert "".join(raw[bert.CHARSMAP]) == base64.b64encode(table).decode()
    assert bytes(got[bert.CHARSMAP]) == table
    assert {k: v for k, v in got.items() if k != bert.CHARSMAP} == {k: v for k, v in raw.items() if k != bert.CHARSMAP}

    jobs = [
        {"op": "tokenize", "text": ASCII},
        {"op": "tokenize", "text": FULLWIDTH},
        {"op": "embed", "input": ASCII, "full": True},
        {"op": "embed", "input": FULLWIDTH, "full": True},
    ]
    res = run_job({"model": str(mounted), "actions": jobs})
    assert res["ok"], res.get("error")
    ascii_ids, wide_ids, ascii_vec, wide_vec = res["results"]
    # The table folds fullwidth forms and the no-break space: same tokens, same vector.
    assert FULLWIDTH != ASCII and wide_ids["ids"] == ascii_ids["ids"]
    assert ascii_vec["dim"] == 64
    np.testing.assert_allclose(wide_vec["vector"], ascii_vec["vector"], atol=1e-6)

    # The translated file is llama.cpp's form: nothing left to claim.
    assert not bert.TEXT.claims(SourceGGUF(mounted))
    untranslated = run_job({"model": str(blob), "actions": [{"op": "embed", "input": ASCII}]})
    assert not untranslated["ok"]


def test_claims_only_a_base64_character_array(blob, tmp_path):
    src = SourceGGUF(blob)
    assert bert.TEXT.claims(src)
    decoded = dict(src.kvs)
    bert.CharsmapFromBase64(bert.CHARSMAP).apply(decoded, src)
    assert decoded[bert.CHARSMAP].element_type == VT.UINT8
    # Multi-character strings, or characters that are not base64, are left alone.
    for items in (["QUJD", "RA=="], list("QU!D")):
        kv = {bert.CHARSMAP: array(VT.STRING, items)}
        bert.CharsmapFromBase64(bert.CHARSMAP).apply(kv, src)
        assert kv[bert.CHARSMAP].element_type == VT.STRING
