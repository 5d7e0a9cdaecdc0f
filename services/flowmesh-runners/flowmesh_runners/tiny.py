"""Tiny random-weight models built locally, for tests and the README tour (no model hub needed).

``python -m flowmesh_runners.tiny DIR`` writes ``DIR/tiny-llama`` (a two-layer Llama with a
word-level tokenizer), ``DIR/tiny-embedder`` (a sentence-transformers model on a two-layer BERT)
``DIR/models.json``, a model map sending every hub id to the tiny Llama (``FLOWMESH_MODEL_MAP``),
and ``DIR/datasets/default`` (``FLOWMESH_DATASETS_DIR=DIR/datasets`` serves it for every dataset name).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CORPUS = [
    "the scheduler placed the task on a worker with a free gpu",
    "a worker runs the task and reports its result to the log",
    "training reports the step the loss and the learning rate",
    "use short descriptive names that say what the value means",
    "tests catch regressions early and document the intended behaviour",
    "any name works tests are optional how should i name variables why write",
    "tom has three apples and buys five more how many apples does he have eight",
    "reply kindly to a customer whose parcel arrived late encourage a friend exam",
]
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "[CLS]", "[SEP]", "[MASK]"]


def tokenizer():
    """A word-level tokenizer over the corpus, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for line in CORPUS for w in line.replace("?", " ? ").replace(".", " . ").split()} | {"?", ".", ",", ":"})
    vocab = {tok: i for i, tok in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def build_llama(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_embedder(path: Path) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    tok = tokenizer()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, max_position_embeddings=256, pad_token_id=tok.pad_token_id)
    raw = path.parent / (path.name + "-raw")
    BertModel(config).save_pretrained(raw)
    tok.save_pretrained(raw)
    word = models.Transformer(str(raw), max_seq_length=128)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pooling = models.Pooling(dim(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(path))
    return path


def build_classifier(path: Path) -> Path:
    """A two-label sequence classifier (NEGATIVE, POSITIVE), the reward model of PPO tests."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tok = tokenizer()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
                        num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    BertForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_dataset(path: Path) -> Path:
    """Rows with the columns FlowMesh's examples name (question/answer, instruction/output,
    prompt/response, chosen/rejected, text), as ``$FLOWMESH_DATASETS_DIR/default``."""
    path.mkdir(parents=True, exist_ok=True)
    pairs = [(CORPUS[i], CORPUS[i + 1]) for i in range(0, len(CORPUS) - 1, 2)]
    with (path / "train.jsonl").open("w") as fh:
        for prompt, answer in pairs:
            row = {"question": prompt, "answer": answer, "instruction": prompt, "output": answer,
                   "prompt": prompt, "response": answer, "chosen": answer, "rejected": "any name works",
                   "text": f"{prompt} {answer}"}
            fh.write(json.dumps(row) + "\n")
    return path


def build_all(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    build_dataset(root / "datasets" / "default")
    llama = build_llama(root / "tiny-llama")
    embedder = build_embedder(root / "tiny-embedder")
    classifier = build_classifier(root / "tiny-classifier")
    mapping = {
        "sentence-transformers/all-MiniLM-L6-v2": "tiny-embedder",
        "BAAI/bge-small-en-v1.5": "tiny-embedder",
        "distilbert/distilbert-base-uncased-finetuned-sst-2-english": "tiny-classifier",
        "*": "tiny-llama",
    }
    (root / "models.json").write_text(json.dumps(mapping, indent=2))
    return {"llama": llama, "embedder": embedder, "classifier": classifier, "map": root / "models.json",
            "datasets": root / "datasets"}


if __name__ == "__main__":
    out = build_all(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-models").resolve())
    print(json.dumps({k: str(v) for k, v in out.items()}))
