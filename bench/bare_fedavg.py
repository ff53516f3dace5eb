"""`python bench/bare_fedavg.py T0 INPUTS`: FedAvg as a researcher writes it in bare PyTorch, the whole-process
counterpart of an fl run (bench/fedavg_overhead.py --whole-process writes INPUTS from that run's config; T0 is its
time.time() when it started this process).

INPUTS (torch.save) holds the clients' training images (uint8) and labels, the official test images and labels with
each client's test rows in them, the normalisation, each round's clients and each (round, client)'s shuffling seed,
the initial model's seed and the hyperparameters. The script builds the small CNN from the seed (fl's `cnn`, layer for
layer, so the same weights), runs the rounds (SGD with momentum, one epoch over shuffled batches, the float64 mean
weighted by training size), then evaluates the final model once, the cheapest correct way: the official test set in
one pass, each client's accuracy gathered from those predictions by its rows. It prints `ACCURACY {json}` (the
per-client accuracies and the pooled one) and, last on stderr, `PHASES {json}`: seconds of imports, load, training,
evaluation and the wall clock at its end; the exit is the caller's to time. Only torch is imported."""
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

T0 = float(sys.argv[1])
marks = {"imports": time.time()}


class CNN(nn.Module):
    """fl/models/small.py's `cnn` (model.norm=none): two conv blocks, a hidden layer, a linear head."""

    def __init__(self, channels: int, size: int, width: int, num_classes: int):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * width * (size // 4) ** 2, 4 * width), nn.ReLU())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


inputs = torch.load(sys.argv[2])
mean = torch.tensor(inputs["mean"]).view(1, -1, 1, 1)
std = torch.tensor(inputs["std"]).view(1, -1, 1, 1)


def prepare(x):
    return (x.float() / 255 - mean) / std


clients = inputs["train"]
marks["load"] = time.time()

torch.manual_seed(inputs["init_seed"])
model = CNN(*inputs["model"])
state = {k: v.clone() for k, v in model.state_dict().items()}
bs = inputs["batch_size"]
for rnd, sampled in enumerate(inputs["sampled"]):
    sums = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
    total = 0
    for cid in sampled:
        x, y = clients[cid]
        model.load_state_dict(state)
        opt = torch.optim.SGD(model.parameters(), lr=inputs["lr"], momentum=inputs["momentum"])
        seed = inputs["seeds"][rnd][cid]
        torch.manual_seed(seed)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        for start in range(0, len(y), bs):
            idx = perm[start:start + bs]
            loss = F.cross_entropy(model(prepare(x[idx])), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for k, v in model.state_dict().items():
            sums[k].add_(v.double(), alpha=len(y))
        total += len(y)
    state = {k: (s / total).to(state[k].dtype) for k, s in sums.items()}
marks["training"] = time.time()

model.load_state_dict(state)
model.eval()
test_x, test_y, ebs = inputs["test_x"], inputs["test_y"], inputs["eval_batch_size"]
with torch.no_grad():
    preds = torch.cat([model(prepare(test_x[i:i + ebs])).argmax(1) for i in range(0, len(test_y), ebs)])
hit = preds == test_y
accuracy = {"clients": [int(hit[rows].sum()) / len(rows) if len(rows) else 0.0 for rows in inputs["test_rows"]],
            "pooled": int(hit.sum()) / len(test_y)}
marks["evaluation"] = time.time()
print("ACCURACY " + json.dumps(accuracy), flush=True)
print("PHASES " + json.dumps({"imports": marks["imports"] - T0, "load": marks["load"] - marks["imports"],
                              "training": marks["training"] - marks["load"],
                              "evaluation": marks["evaluation"] - marks["training"],
                              "returned_at": time.time()}), file=sys.stderr, flush=True)
