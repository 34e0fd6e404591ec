"""``generate`` on a tiny randomly initialised GPT-2 (no download): 3 new tokens, greedy."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    lm = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 32, (1, 4))
    out = lm.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    print(f"generated {out.shape[1] - ids.shape[1]} tokens")


if __name__ == "__main__":
    main()
