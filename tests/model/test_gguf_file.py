"""engine/model/gguf_file.py reads what the gguf package's own reader reads: every metadata value, and each
tensor's type, shape and data bytes, on a small file written by the gguf package (scalars, strings, arrays of
numbers and of strings, plain and quantized tensors)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from kvloop.engine.model.gguf_file import GGUFFile


def reader_value(field):
    """A GGUFReader field as a Python value, as the loader used to read it."""
    if field.types[0] == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].item() for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].item()


def test_reads_what_gguf_reader_reads(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_int32("tiny.signed", -7)
    writer.add_float32("llama.rope.freq_base", 100000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("general.name", "tiny ünïcode")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "é", ""])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1])
    writer.add_array("tiny.scores", [0.5, -1.25])
    rng = np.random.default_rng(0)
    writer.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((3, 64)).astype(np.float16))
    for name, kind in (("token_embd.weight", GGMLQuantizationType.Q8_0),
                       ("blk.0.attn_q.weight", GGMLQuantizationType.Q4_1)):
        data = quantize(rng.standard_normal((5, 64)).astype(np.float32), kind)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours, theirs = GGUFFile(path), GGUFReader(path)
    assert ours.fields == {key: reader_value(f) for key, f in theirs.fields.items()
                           if not key.startswith("GGUF.")}
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape)
        assert str(list(a.shape)) == str(list(b.shape))  # the checkpoint's fingerprint hashes this text
        assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()
