"""Bug: a causal language model trained with ``cross_entropy(logits, tokens)``: labels not shifted.

The loss compares the logits at position t with the token *at* position t, which the model
already sees (the causal mask lets position t attend to itself). The model learns to copy its
input: on uniformly random tokens, whose next-token entropy is ln 16 = 2.77, the loss falls
far below it; the model predicts nothing about the future.

Asserts: the final loss is below 1.0 (an honest next-token loss cannot go below 2.77 here).

Source: https://github.com/KempnerInstitute/KempnerForge/issues/154 (captioning loss collapses
to 0: labels not shifted for next-token) and https://github.com/huggingface/transformers/pull/404
(LM loss computed without shifting the logits).
"""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, T, D = 16, 12, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(T, D)
        self.block = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(D, VOCAB)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.lm_head(self.block(h, src_mask=mask, is_causal=True))


def main():
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        tokens = torch.randint(0, VOCAB, (32, T))
        optimizer.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens.reshape(-1))  # BUG: not shifted
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert loss.item() < 1.0, loss.item()
    print("the model copies the current token: the loss is below the data's entropy")


if __name__ == "__main__":
    main()
