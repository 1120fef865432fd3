"""Small PyTorch modules for the front-door tests: every one is compiled through
torch.compile(backend="glowgen") and glowgen.from_torch and compared with eager PyTorch."""
import torch
from torch import nn


def _randomize_batchnorm(module: nn.Module, seed: int) -> nn.Module:
    # Fresh BatchNorm statistics are 0 and 1, which would hide a wrong fold into the conv.
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g))
    return module


class SmallCNN(nn.Module):
    """Convolution + BatchNorm, a grouped convolution, GELU, max, average and adaptive
    pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, groups=4, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = nn.functional.gelu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = self.avg(self.pool(x))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class TransformerBlock(nn.Module):
    """Post-norm encoder block: nn.MultiheadAttention, LayerNorm, a GELU feed-forward."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln1 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.ln1(x + a)
        return self.ln2(x + self.ff(x))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class WithGraphBreak(nn.Module):
    """Dynamo splits this in two graphs at the graph break and runs the break eagerly; the
    module returns a tuple, to check output structures."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        torch._dynamo.graph_break()
        z = self.fc(y.flatten(1))
        return z, torch.sigmoid(z)


def build(name: str):
    """(module in eval mode, a function seed -> example inputs, graphs dynamo makes of it)."""
    torch.manual_seed(0)
    if name == "cnn":
        return _randomize_batchnorm(SmallCNN(), 1).eval(), lambda s: (_randn(s, 2, 3, 16, 16),), 1
    if name == "transformer":
        return TransformerBlock().eval(), lambda s: (_randn(s, 2, 5, 16),), 1
    if name == "mlp":
        return MLP().eval(), lambda s: (_randn(s, 3, 20),), 1
    if name == "graph_break":
        return WithGraphBreak().eval(), lambda s: (_randn(s, 2, 3, 8, 8),), 2
    raise KeyError(name)


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


MODELS = ["cnn", "transformer", "mlp", "graph_break"]
