#!/usr/bin/python3
"""Trains the small byte-level BPE tokenizer examples/documents uses.

Writes an HF tokenizer.json of the GPT-2 family (ByteLevel pre-tokenizer and
decoder, BPE merges, one special token <|endoftext|> as the end of a
document) learned from text that ships with every Debian system
(/usr/share/common-licenses). The committed tokenizer.json is this script's
output; run it again to change the vocabulary size:

  examples/documents/train_tokenizer.py 1024 examples/documents/tokenizer.json

Plain Python, no packages: pre-tokens are cut with an ASCII version of GPT-2's
pattern (the license texts are ASCII), merges are learned by the classic
algorithm (count adjacent pairs weighted by pre-token frequency, merge the
most frequent, ties broken by the pair's strings so the output is
reproducible).
"""
import collections
import glob
import json
import re
import sys

# GPT-2's pre-tokenizer pattern with ASCII classes for \p{L} and \p{N}.
PATTERN = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

# GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to
# code points from 256 up, so every byte is one visible character.
def byte_alphabet():
    keep = (list(range(ord("!"), ord("~") + 1)) +
            list(range(ord("¡"), ord("¬") + 1)) +
            list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def main():
    vocab_size, out = int(sys.argv[1]), sys.argv[2]
    alphabet = byte_alphabet()
    counts = collections.Counter()
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except (IsADirectoryError, PermissionError):
            continue
        for piece in PATTERN.findall(text):
            counts["".join(alphabet[b] for b in piece.encode())] += 1
    words = {w: list(w) for w in counts}
    vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet,
                                                          key=lambda b: alphabet[b]))}
    merges = []
    special = "<|endoftext|>"
    while len(vocab) + 1 < vocab_size:
        pairs = collections.Counter()
        for w, symbols in words.items():
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        vocab[merged] = len(vocab)
        for w, symbols in words.items():
            i, out_symbols = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out_symbols.append(merged)
                    i += 2
                else:
                    out_symbols.append(symbols[i])
                    i += 1
            words[w] = out_symbols
    eod = len(vocab)
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": eod, "content": special, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{out}: {len(vocab) + 1} tokens, {len(merges)} merges, "
          f"<|endoftext|> = {eod}")


if __name__ == "__main__":
    main()
