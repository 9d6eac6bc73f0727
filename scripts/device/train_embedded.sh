#!/usr/bin/env bash
# Train the embedded default model on the lent H200 (see models/README.md).
# Runs in the repository root on the device machine. Expects the extracted corpus in
# .emb_data/{train.txt,heldout.txt} (ignored via .git/info/exclude, sent with carry=[".emb_data"])
# and the tokenizer in models/default/. Writes to $OUT (default ./emb_out):
#   model/{config.json,generation_config.json,model.safetensors.part-aa,-ab,...}, train_log.json, stdout.txt
# model.safetensors is split into 15 MiB parts because the device tool returns files of <=16 MiB;
# rejoin with: cat model.safetensors.part-* > model.safetensors
set -euo pipefail
OUT=${OUT:-emb_out}
MINUTES=${MINUTES:-4.5}
mkdir -p "$OUT/model"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
PYTHONUNBUFFERED=1 python3 tools/train_embedded.py --data .emb_data --tokenizer-dir models/default \
    --out "$OUT/model" --minutes "$MINUTES" --log "$OUT/train_log.json" "$@" 2>&1 | tee "$OUT/stdout.txt"
rm -f "$OUT/model/tokenizer.json" "$OUT/model/tokenizer_config.json"
(cd "$OUT/model" && split -b 15M -a 2 model.safetensors model.safetensors.part- && rm model.safetensors && ls -la)
