"""Capture never changes the program: what the program computes under ``capture(...)`` is what
it computes without it, the accuracy check included (issue: a dropout step's loss was 0.1462
under ``capture(accuracy=True)`` against 0.1005 without, because the check forced inductor's
``fallback_random`` on the program's own compile)."""

from __future__ import annotations

import pytest
import torch

import reproarchive


class Step(torch.nn.Module):
    """A training step's forward: a layer, dropout, a loss (random numbers in training mode)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.layer(x))).pow(2).mean()


def _loss_and_grad(backend) -> tuple[float, torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Step()
    x = torch.randn(32, 16)
    compiled = torch.compile(model, backend=backend)
    loss = compiled(x)
    loss.backward()
    return loss.item(), model.layer.weight.grad.clone()


@pytest.mark.slow
def test_an_accuracy_capture_leaves_a_dropout_step_s_numbers_as_they_are(tmp_path):
    plain_loss, plain_grad = _loss_and_grad("inductor")
    captured_loss, captured_grad = _loss_and_grad(reproarchive.capture("inductor", path=tmp_path, accuracy=True))
    assert captured_loss == plain_loss  # the same draws, by inductor's own RNG code, as without capture
    assert torch.equal(captured_grad, plain_grad)
    # and the check (on its own fallback_random copy) called the correct graph correct
    assert not list(tmp_path.glob("*.tar.zst"))
    torch._dynamo.reset()
