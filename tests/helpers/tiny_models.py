"""Tiny BERT and GPT-2 models with tokenizers trained here, saved as ordinary Hugging Face folders; tiny T5, BART
and Marian encoder-decoders over the tiny BERT's tokenizer.

Built in about a second from text that ships with ortlab's embedded assets, so tests never download.
"""

from __future__ import annotations

from pathlib import Path


def _texts() -> list[str]:
    import csv
    import json

    from ortlab.assets import embedded_dataset

    rt, _ = embedded_dataset("rotten-tomatoes")
    with open(rt, encoding="utf-8") as f:
        texts = [row["text"] for row in csv.DictReader(f)][:3000]
    hamlet, _ = embedded_dataset("hamlet")
    texts += Path(hamlet).read_text(encoding="utf-8", errors="ignore").splitlines()
    ner, _ = embedded_dataset("synthetic-ner")
    texts += [" ".join(json.loads(line)["tokens"]) for line in Path(ner).read_text().splitlines()[:500]]
    return texts


def build_tiny_bert(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(_texts(), trainers.WordPieceTrainer(vocab_size=2000, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_gpt2(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _texts(),
        trainers.BpeTrainer(
            vocab_size=2000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", model_max_length=128
    )
    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=128, n_embd=64, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_llama(folder: Path, tokenizer_folder: Path) -> Path:
    """A 2-layer Llama-architecture causal LM (grouped-query attention, tied embeddings, as SmolLM2) over the tiny
    GPT-2's byte-level BPE tokenizer, seeded."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_bart(tokenizer, layers: int = 2, positions: int = 64):
    """A BART encoder-decoder of `layers` layers each side over `tokenizer`'s vocabulary (a BERT WordPiece one:
    [CLS] starts, [SEP] ends), dropout off, seeded."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=positions,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.sep_token_id,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config)


def tiny_t5(tokenizer):
    """A T5 encoder-decoder (2 layers each side) over `tokenizer`'s vocabulary, dropout off, seeded. T5 starts
    decoding from the pad token, as the real ones do."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        dropout_rate=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5ForConditionalGeneration(config)


def tiny_marian(tokenizer):
    """A MarianMT model (2 layers each side) over `tokenizer`'s vocabulary. Marian's own tokenizer needs
    sentencepiece, which this environment does not have: the model is tested with the WordPiece one."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
    )
    return MarianMTModel(config)


SEQ2SEQ_BUILDERS = {"t5": tiny_t5, "bart": tiny_bart, "marian": tiny_marian}


def build_tiny_seq2seq(folder: Path, kind: str, tokenizer_folder: Path) -> Path:
    """A model folder (config, weights, tokenizer) of a tiny `kind` ('t5', 'bart', 'marian') encoder-decoder,
    with the tokenizer of `tokenizer_folder` (the tiny BERT's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    SEQ2SEQ_BUILDERS[kind](tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# Words that are whole tokens of the tiny BERT's vocabulary (it is trained on movie reviews).
TOY_WORDS = [
    "the",
    "good",
    "bad",
    "movie",
    "film",
    "story",
    "love",
    "time",
    "life",
    "great",
    "funny",
    "best",
    "world",
    "people",
    "family",
    "heart",
]


def write_reverse_pairs(path: Path, n: int = 200, seed: int = 0) -> Path:
    """A CSV of a toy seq2seq task a tiny model learns a little of in a few dozen steps: `source` is 2-4 words,
    `target` the same words in reverse order."""
    import csv
    import random

    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "target"])
        for _ in range(n):
            words = [rng.choice(TOY_WORDS) for _ in range(rng.randint(2, 4))]
            writer.writerow([" ".join(words), " ".join(reversed(words))])
    return path


REVIEW_WORDS = ["good", "bad", "film", "plot", "actor", "slow", "funny", "great", "dull", "scene"]


def write_reviews(path: Path, rows: int, words: int = 6) -> Path:
    """A CSV of `rows` numbered reviews ("review <i> " and `words` words) labelled 'a'/'b' in turn: every row
    tells which row it is, so a test can see which rows a run (or each of its processes) read, and in what order."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(rows):
            text = " ".join(REVIEW_WORDS[(i * 7 + k) % len(REVIEW_WORDS)] for k in range(words))
            w.writerow([f"review {i} {text}", "ab"[i % 2]])
    return path


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_chat_llama(folder: Path, chat_template: str | None = CHATML) -> Path:
    """A 2-layer Llama-architecture causal LM with a byte-level BPE tokenizer trained here, whose end-of-turn
    token `<|im_end|>` is its EOS, and (by default) a ChatML chat template as SmolLM2's."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [*_texts()[:4000], "Is this review fresh or rotten?", "fresh", "rotten", "user", "assistant", "system"]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=1500, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=256,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
