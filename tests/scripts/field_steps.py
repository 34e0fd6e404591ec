"""Training programs from the field whose units are optimizer steps and turns, not backward
passes (issue 38, items 1 and 3), one per CASE (argv[1]): healthy ones that must stay silent, and
the bugs kept beside them.

    python field_steps.py CASE

* ``lora_accumulation``: peft's LoRA on a tiny Llama under the HF ``Trainer`` with gradient
  accumulation 16 and a linear warmup from lr 0 (peft's ``dora_finetuning.py``): ``lora_B``
  starts at zero, so ``lora_A``'s gradient is exactly zero until an optimizer step with lr > 0
  moved ``lora_B``; every recorded backward pass comes before it;
* ``infogan``: PyTorch-GAN's ``infogan.py``: a generator and a discriminator with three heads,
  trained by three losses in turns (generator, discriminator, info), so each head gets a
  gradient in some passes only;
* ``wgan_gp``: PyTorch-GAN's ``wgan_gp.py``: five critic passes (with a gradient penalty through
  ``autograd.grad``) per generator pass;
* bugs kept: ``lora_b_frozen`` (``lora_B`` frozen by a name filter: ``lora_A`` never learns),
  ``infogan_no_info`` (the info loss dropped: the label and code heads never train),
  ``infogan_info_stops`` (the info loss dropped after five iterations, in the watched steps:
  the heads' turns stop).

Everything runs on the CPU on random data, with nothing downloaded.
"""

from __future__ import annotations

import itertools
import sys
import tempfile

import torch
from torch import nn
from torch.nn import functional as F


def lora(accumulation: int, warmup: int, freeze_b: bool) -> None:
    """A tiny Llama with LoRA adapters on its attention's q and v, trained by the Trainer."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=16)
    model = get_peft_model(LlamaForCausalLM(config),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                      lora_dropout=0.0, task_type="CAUSAL_LM"))
    if freeze_b:  # meant to freeze the base's biases ("b"), it freezes every lora_B
        for name, p in model.named_parameters():
            if "_B" in name:
                p.requires_grad_(False)
    ids = torch.randint(0, 32, (3 * accumulation, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, max_steps=3, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=accumulation, learning_rate=1e-3,
                                 warmup_steps=warmup, lr_scheduler_type="linear", use_cpu=True,
                                 report_to=[], save_strategy="no", logging_strategy="no",
                                 disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    print(f"trained {trainer.state.global_step} optimizer steps")


class Generator(nn.Module):
    def __init__(self, latent: int = 8, classes: int = 4, code: int = 2) -> None:
        super().__init__()
        self.l1 = nn.Linear(latent + classes + code, 32)
        self.blocks = nn.Sequential(nn.BatchNorm1d(32), nn.LeakyReLU(0.2), nn.Linear(32, 16),
                                    nn.Tanh())

    def forward(self, noise: torch.Tensor, labels: torch.Tensor,
                code: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.l1(torch.cat((noise, labels, code), -1)))


class InfoDiscriminator(nn.Module):
    """A trunk and three heads: real or fake, the class, the continuous code."""

    def __init__(self, classes: int = 4, code: int = 2) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.25))
        self.adv_layer = nn.Linear(32, 1)
        self.aux_layer = nn.Sequential(nn.Linear(32, classes))  # logits: the loss is CE
        self.latent_layer = nn.Linear(32, code)

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.trunk(img)
        return self.adv_layer(out), self.aux_layer(out), self.latent_layer(out)


def infogan(info: bool, iterations: int = 8, batch: int = 16, info_until: int = 8) -> None:
    """PyTorch-GAN's loop: the generator's step, the discriminator's, then the info step over
    both (``info``, in the first ``info_until`` iterations; dropped: a bug)."""
    generator, discriminator = Generator(), InfoDiscriminator()
    adversarial, categorical, continuous = nn.MSELoss(), nn.CrossEntropyLoss(), nn.MSELoss()
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_info = torch.optim.Adam(itertools.chain(generator.parameters(),
                                                discriminator.parameters()),
                                lr=2e-4, betas=(0.5, 0.999))
    valid, fake = torch.ones(batch, 1), torch.zeros(batch, 1)

    def sample() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        classes = torch.randint(0, 4, (batch,))
        return (torch.randn(batch, 8), F.one_hot(classes, 4).float(),
                torch.rand(batch, 2) * 2 - 1, classes)

    for iteration in range(iterations):
        real = torch.rand(batch, 16) * 2 - 1
        opt_g.zero_grad()
        z, labels, code, _ = sample()
        images = generator(z, labels, code)
        validity, _, _ = discriminator(images)
        adversarial(validity, valid).backward()
        opt_g.step()

        opt_d.zero_grad()
        real_pred, _, _ = discriminator(real)
        fake_pred, _, _ = discriminator(images.detach())
        ((adversarial(real_pred, valid) + adversarial(fake_pred, fake)) / 2).backward()
        opt_d.step()

        if info and iteration < info_until:
            opt_info.zero_grad()
            z, labels, code, classes = sample()
            _, pred_label, pred_code = discriminator(generator(z, labels, code))
            (categorical(pred_label, classes) + 0.1 * continuous(pred_code, code)).backward()
            opt_info.step()


class WGAN(nn.Module):
    """A generator and its critic in one module, each loss a method (as a LightningModule's
    ``training_step`` holds them)."""

    def __init__(self, batch: int = 16) -> None:
        super().__init__()
        self.batch = batch
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16),
                                       nn.Tanh())
        self.critic = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def penalty(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        alpha = torch.rand(real.size(0), 1)
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        scores = self.critic(mixed)
        grads = torch.autograd.grad(outputs=scores, inputs=mixed,
                                    grad_outputs=torch.ones_like(scores), create_graph=True,
                                    retain_graph=True, only_inputs=True)[0]
        return ((grads.norm(2, dim=1) - 1) ** 2).mean()

    def critic_loss(self, real: torch.Tensor) -> torch.Tensor:
        fake = self.generator(torch.randn(self.batch, 8)).detach()
        gp = self.penalty(real, fake)
        return -self.critic(real).mean() + self.critic(fake).mean() + 10 * gp

    def generator_loss(self) -> torch.Tensor:
        return -self.critic(self.generator(torch.randn(self.batch, 8))).mean()


def wgan_gp(iterations: int = 30, n_critic: int = 5) -> None:
    """PyTorch-GAN's loop: a critic step every batch (the generator's images detached), a
    generator step every ``n_critic``; the gradient penalty is a pass of its own
    (``autograd.grad``)."""
    gan = WGAN()
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(gan.critic.parameters(), lr=2e-4, betas=(0.5, 0.999))
    for i in range(iterations):
        opt_d.zero_grad()
        gan.critic_loss(torch.rand(gan.batch, 16) * 2 - 1).backward()
        opt_d.step()
        opt_g.zero_grad()
        if i % n_critic == 0:
            gan.generator_loss().backward()
            opt_g.step()


CASES = {
    "lora_accumulation": lambda: lora(accumulation=16, warmup=2, freeze_b=False),
    "lora_b_frozen": lambda: lora(accumulation=2, warmup=0, freeze_b=True),
    "infogan": lambda: infogan(info=True),
    "infogan_no_info": lambda: infogan(info=False),
    "infogan_info_stops": lambda: infogan(info=True, info_until=5),
    "wgan_gp": wgan_gp,
}


if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
