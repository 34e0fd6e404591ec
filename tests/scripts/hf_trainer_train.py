"""A real ``transformers.Trainer`` run: 3 CPU steps of a tiny randomly initialised GPT-2 (no
download); exits with argv[1] (default 0) after training."""

import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 32, (6, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, max_steps=3, per_device_train_batch_size=2, use_cpu=True,
                                 report_to=[], save_strategy="no", logging_strategy="no",
                                 disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    print(f"trained {trainer.state.global_step} steps")
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)


if __name__ == "__main__":
    main()
