"""Backbones that turn a sample into a face embedding, written here (no torchvision):

- `MLP`: for feature-vector samples (the synthetic task's default, and tests); batch-normed
  layers and a batch-normed embedding, as face backbones end.
- `SmallCNN`: three strided convolutions, for small synthetic images and CPU smoke runs.
- `IResNet`: the improved ResNet used for 112x112 face crops (depths 18 and 50): a 3x3 stem,
  pre-activation-style blocks (BN, conv, BN, PReLU, conv, BN) in four stages of stride 2,
  then BN, flatten, a linear layer to the embedding and a final BN.
"""
from __future__ import annotations

from torch import nn

from .choices import BACKBONES


class MLP(nn.Module):
    """Example:
        >>> import torch
        >>> MLP(32, 16)(torch.randn(4, 32)).shape
        torch.Size([4, 16])
    """

    def __init__(self, in_dim: int, feat_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, feat_dim), nn.BatchNorm1d(feat_dim))

    def forward(self, x):
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """Example:
        >>> import torch
        >>> SmallCNN(16)(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 16])
    """

    def __init__(self, feat_dim: int, in_channels: int = 3, width: int = 16):
        super().__init__()
        layers, c = [], in_channels
        for out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            c = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(c, feat_dim)

    def forward(self, x):
        return self.fc(self.features(x))


class _IBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin, eps=1e-5), nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-5),
            nn.PReLU(cout), nn.Conv2d(cout, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-5))
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, eps=1e-5))

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


class IResNet(nn.Module):
    """IResNet for 112x112 crops (any size divisible by 16 works; the linear layer is sized
    for `input_size`).

    Args:
        layers: blocks per stage, e.g. (2, 2, 2, 2) for IResNet-18, (3, 4, 14, 3) for -50.
        feat_dim: embedding size (512 in the literature).

    Example:
        >>> import torch
        >>> IResNet((1, 1, 1, 1), 32, input_size=32, width=8)(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 32])
    """

    def __init__(self, layers=(2, 2, 2, 2), feat_dim: int = 512, input_size: int = 112, width: int = 64,
                 dropout: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width, eps=1e-5),
                                  nn.PReLU(width))
        blocks, c = [], width
        for i, n in enumerate(layers):
            out = width * 2 ** i
            for j in range(n):
                blocks.append(_IBlock(c, out, 2 if j == 0 else 1))
                c = out
        self.blocks = nn.Sequential(*blocks)
        side = input_size // 16
        self.bn = nn.BatchNorm2d(c, eps=1e-5)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(c * side * side, feat_dim)
        self.features = nn.BatchNorm1d(feat_dim, eps=1e-5)

    def forward(self, x):
        x = self.bn(self.blocks(self.stem(x)))
        return self.features(self.fc(self.dropout(x.flatten(1))))


def build_backbone(name: str, feat_dim: int, input_shape: tuple[int, ...]) -> nn.Module:
    """A backbone by name for samples of `input_shape` ((D,) vectors or (3, H, W) images)."""
    if name == "mlp":
        n = 1
        for s in input_shape:
            n *= s
        return MLP(n, feat_dim)
    if len(input_shape) != 3:
        raise ValueError(f"backbone {name!r} needs images (3, H, W), the data gives samples of shape {input_shape}; "
                         f"use --backbone mlp")
    if name == "cnn":
        return SmallCNN(feat_dim, input_shape[0])
    if name in ("iresnet18", "iresnet50"):
        if input_shape[1] % 16 or input_shape[1] != input_shape[2]:
            raise ValueError(f"IResNet needs square images with a side divisible by 16, got {input_shape}")
        layers = (2, 2, 2, 2) if name == "iresnet18" else (3, 4, 14, 3)
        return IResNet(layers, feat_dim, input_size=input_shape[1])
    raise ValueError(f"backbone must be one of {BACKBONES}, got {name!r}")
