"""Byte check of what ExampleConnector saved: per prompt folder, its per-layer safetensors files;
the tensor bytes from each file's own header (shape x dtype), against tokens x the model's KV bytes."""
import json, struct, sys
from collections import Counter
from pathlib import Path

root = Path(sys.argv[1])
cfg = json.loads(Path(sys.argv[2]).read_text())
layers = cfg["num_hidden_layers"]
heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
per_token_layer = 2 * heads * dim * 2   # K and V, bf16
folders = [p for p in root.iterdir() if p.is_dir()]
files = tensor_bytes = disk_bytes = tokens = 0
shapes, per_folder, dtypes = Counter(), Counter(), Counter()
for folder in folders:
    fs = sorted(folder.glob("*.safetensors"))
    per_folder[len(fs)] += 1
    for f in fs:
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        t = header["kv_cache"]
        begin, end = t["data_offsets"]
        files += 1; tensor_bytes += end - begin; disk_bytes += len(raw)
        shapes[tuple(t["shape"][1:])] += 1; dtypes[t["dtype"]] += 1
        tokens += t["shape"][0]
tok_per_req = tokens // max(layers, 1)
expected = tokens * per_token_layer
print(json.dumps({"dir": str(root), "prompt_folders": len(folders), "files": files,
                  "files_per_folder": dict(per_folder), "tensor_shape_tail": {str(k): v for k, v in shapes.items()},
                  "dtypes": dict(dtypes), "tokens_saved_all_layers": tokens,
                  "tokens_saved_per_layer": tok_per_req, "blocks_of_128": tok_per_req / 128,
                  "tensor_bytes": tensor_bytes, "disk_bytes": disk_bytes,
                  "expected_bytes_tokens_x_2xkv_headsxhead_dimx2B": expected,
                  "bytes_per_block": tensor_bytes / (tok_per_req / 128) if tok_per_req else None,
                  "exact": tensor_bytes == expected}, indent=1))
