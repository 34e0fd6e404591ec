"""A tiny GAN: a generator, a discriminator and a loss module, trained alternately.

Each iteration has two backward passes (the discriminator's, then the generator's), so the trace
has two steps per iteration and three models: generator, discriminator and criterion.

    hooktrace run samples/gan.py --iterations 2
"""

import argparse

import torch
from torch import nn

LATENT = 16


def make_generator() -> nn.Module:
    return nn.Sequential(nn.Linear(LATENT, 64), nn.ReLU(), nn.Linear(64, 28 * 28), nn.Tanh())


def make_discriminator() -> nn.Module:
    return nn.Sequential(nn.Linear(28 * 28, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = make_generator()
    discriminator = make_discriminator()
    criterion = nn.BCEWithLogitsLoss()
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4)
    real_label = torch.ones(args.batch_size, 1)
    fake_label = torch.zeros(args.batch_size, 1)

    for iteration in range(args.iterations):
        real = torch.rand(args.batch_size, 28 * 28) * 2 - 1
        fake = generator(torch.randn(args.batch_size, LATENT))

        # discriminator step: the fake batch is detached, so no gradient reaches the generator
        opt_d.zero_grad()
        loss_d = criterion(discriminator(real), real_label) + criterion(
            discriminator(fake.detach()), fake_label
        )
        loss_d.backward()
        opt_d.step()

        # generator step: gradient flows through the discriminator into the generator
        opt_g.zero_grad()
        loss_g = criterion(discriminator(fake), real_label)
        loss_g.backward()
        opt_g.step()
        print(f"iteration {iteration}: loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")


if __name__ == "__main__":
    main()
