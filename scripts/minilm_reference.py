"""Reference hidden states of all-MiniLM-L6-v2 from PyTorch/transformers, for
drove-bert's parity test. Run once; the output is committed as a small fixture.

    python3 -m pip install torch transformers   # from PyPI
    bash scripts/fetch-assets.sh
    python3 scripts/minilm_reference.py assets/minilm crates/drove-bert/tests/fixtures/minilm_reference.json
"""
import json
import sys

import torch
import transformers
from transformers import BertModel, BertTokenizerFast

SENTENCES = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn",
]


def main(model_dir, out_path):
    tokenizer = BertTokenizerFast.from_pretrained(model_dir)
    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    out = {
        "generator": "scripts/minilm_reference.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentences": SENTENCES,
        "input_ids": enc["input_ids"].tolist(),
        "token_type_ids": enc["token_type_ids"].tolist(),
        "attention_mask": enc["attention_mask"].tolist(),
        "hidden_size": hidden.shape[-1],
        # Rounded to 7 significant digits: well below the 1e-4 tolerance.
        "last_hidden_state": [[[float(f"{v:.7g}") for v in tok] for tok in seq] for seq in hidden.tolist()],
    }
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path}: {hidden.shape}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
