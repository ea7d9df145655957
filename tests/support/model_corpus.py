"""Dynamo graphs of real model architectures: random weights, small inputs, no compile.

The models come from ``transformers`` (tiny configs of its own model classes: language models,
encoders, encoder-decoders, vision transformers, CNNs, a detection head, speech encoders) and
from ``MobileNetV3`` below, written here with ``nn.Hardswish``/``nn.Hardsigmoid`` and
``F.hardswish`` as torchvision's and timm's are (neither imports with this torch wheel: torchvision
from the registry is built for another torch, and timm imports torchvision). ``graphs(name)``
compiles the model with a backend that only records what Dynamo hands it and runs it eagerly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------
# MobileNetV3 (Howard et al. 2019), small: inverted residuals with squeeze-excitation and
# hard-swish, as torchvision's mobilenet_v3_small and timm's mobilenetv3_small_050 build it


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)
        self.scale = nn.Hardsigmoid()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.scale(self.fc2(torch.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, expanded: int, cout: int, kernel: int, stride: int, se: bool, hswish: bool):
        super().__init__()
        act = nn.Hardswish if hswish else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers += [nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded), act()]
        layers += [
            nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded),
            act(),
        ]
        if se:
            layers.append(SqueezeExcitation(expanded, max(8, expanded // 4)))
        layers += [nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    # (kernel, expanded, out, squeeze-excite, hard-swish, stride): mobilenet_v3_small's first blocks
    SETTINGS = (
        (3, 16, 16, True, False, 2),
        (3, 72, 24, False, False, 2),
        (3, 88, 24, False, False, 1),
        (5, 96, 40, True, True, 2),
        (5, 240, 40, True, True, 1),
    )

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        blocks, cin = [], 16
        for kernel, expanded, cout, se, hswish, stride in self.SETTINGS:
            blocks.append(InvertedResidual(cin, expanded, cout, kernel, stride, se, hswish))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Conv2d(cin, 64, 1)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        x = F.hardswish(x)  # the functional form too, as timm's conv heads call it
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(F.dropout(x, 0.2, self.training))


class DeprecatedWrappers(nn.Module):
    """A decoder head written with the deprecated functional wrappers older models still call
    (``F.upsample``, ``F.upsample_bilinear``, ``F.sigmoid``, ``F.tanh``, ``F.hardsigmoid``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = F.upsample(self.conv(x), scale_factor=2, mode="nearest")
        z = F.upsample_bilinear(y, scale_factor=0.5) + F.upsample_nearest(x.mean(1, keepdim=True), scale_factor=1)
        return F.sigmoid(z) * F.tanh(z) + F.hardsigmoid(z)


# --------------------------------------------------------------------------------------------
# transformers' model classes with tiny configs

_TEXT = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
_DECODER = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}

_SEQ2SEQ = {
    "vocab_size": 128,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}
_SPEECH = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [8, 8],
    "conv_kernel": [10, 3],
    "conv_stride": [5, 2],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
}

# name: (model class, config class, config keywords, input kind)
TRANSFORMERS: dict[str, tuple[str, str, dict, str]] = {
    # encoders
    "bert": ("BertModel", "BertConfig", _TEXT, "text"),
    "roberta": ("RobertaModel", "RobertaConfig", _TEXT, "text"),
    "distilbert": (
        "DistilBertModel",
        "DistilBertConfig",
        {"vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "max_position_embeddings": 64},
        "text",
    ),
    "albert": ("AlbertModel", "AlbertConfig", {**_TEXT, "embedding_size": 16}, "text"),
    "electra": ("ElectraModel", "ElectraConfig", {**_TEXT, "embedding_size": 16}, "text"),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", _TEXT, "text"),
    "mobilebert": (
        "MobileBertModel",
        "MobileBertConfig",
        {**_TEXT, "embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16},
        "text",
    ),
    "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", {**_TEXT, "embedding_size": 32}, "text"),
    "convbert": ("ConvBertModel", "ConvBertConfig", {**_TEXT, "embedding_size": 32}, "text"),
    "xlm_roberta": ("XLMRobertaModel", "XLMRobertaConfig", _TEXT, "text"),
    "funnel": (
        "FunnelModel",
        "FunnelConfig",
        {
            "vocab_size": 128,
            "d_model": 32,
            "n_head": 2,
            "d_head": 16,
            "d_inner": 64,
            "block_sizes": [1, 1],
            "num_decoder_layers": 1,
        },
        "text",
    ),
    # decoders
    "gpt2": (
        "GPT2Model",
        "GPT2Config",
        {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64},
        "text",
    ),
    "gpt_neo": (
        "GPTNeoModel",
        "GPTNeoConfig",
        {
            "vocab_size": 128,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "attention_types": [[["global", "local"], 1]],
            "max_position_embeddings": 64,
        },
        "text",
    ),
    "gpt_neox": ("GPTNeoXModel", "GPTNeoXConfig", _TEXT, "text"),
    "gptj": (
        "GPTJModel",
        "GPTJConfig",
        {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 8, "n_positions": 64},
        "text",
    ),
    "bloom": ("BloomModel", "BloomConfig", {"vocab_size": 128, "hidden_size": 32, "n_layer": 2, "n_head": 2}, "text"),
    "opt": (
        "OPTModel",
        "OPTConfig",
        {
            "vocab_size": 128,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "ffn_dim": 64,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 64,
        },
        "text",
    ),
    "falcon": (
        "FalconModel",
        "FalconConfig",
        {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2},
        "text",
    ),
    "llama": ("LlamaModel", "LlamaConfig", _DECODER, "text"),
    "mistral": ("MistralModel", "MistralConfig", _DECODER, "text"),
    "qwen2": ("Qwen2Model", "Qwen2Config", _DECODER, "text"),
    "qwen3": ("Qwen3Model", "Qwen3Config", {**_DECODER, "head_dim": 8}, "text"),
    "gemma": ("GemmaModel", "GemmaConfig", {**_DECODER, "head_dim": 8}, "text"),
    "gemma2": ("Gemma2Model", "Gemma2Config", {**_DECODER, "head_dim": 8}, "text"),
    "phi": ("PhiModel", "PhiConfig", _DECODER, "text"),
    "phi3": ("Phi3Model", "Phi3Config", {**_DECODER, "pad_token_id": 0}, "text"),
    "stablelm": ("StableLmModel", "StableLmConfig", _DECODER, "text"),
    "starcoder2": ("Starcoder2Model", "Starcoder2Config", _DECODER, "text"),
    "olmo": ("OlmoModel", "OlmoConfig", _DECODER, "text"),
    "mixtral": (
        "MixtralModel",
        "MixtralConfig",
        {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
        "text",
    ),
    # encoder-decoders
    "t5": (
        "T5Model",
        "T5Config",
        {"vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 2},
        "seq2seq",
    ),
    "bart": (
        "BartModel",
        "BartConfig",
        _SEQ2SEQ,
        "seq2seq",
    ),
    "marian": (
        "MarianModel",
        "MarianConfig",
        {**_SEQ2SEQ, "pad_token_id": 0, "decoder_start_token_id": 0},
        "seq2seq",
    ),
    # vision transformers
    "vit": ("ViTModel", "ViTConfig", _VIT, "image32"),
    "deit": ("DeiTModel", "DeiTConfig", _VIT, "image32"),
    "beit": ("BeitModel", "BeitConfig", {**_VIT, "vocab_size": 128}, "image32"),
    "dinov2": ("Dinov2Model", "Dinov2Config", _VIT, "image32"),
    "swin": (
        "SwinModel",
        "SwinConfig",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4},
        "image32",
    ),
    "swinv2": (
        "Swinv2Model",
        "Swinv2Config",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4},
        "image32",
    ),
    "levit": (
        "LevitModel",
        "LevitConfig",
        {
            "image_size": 32,
            "hidden_sizes": [16, 32, 48],
            "num_attention_heads": [1, 2, 3],
            "depths": [1, 1, 1],
            "key_dim": [8, 8, 8],
        },
        "image32",
    ),
    "mobilevit": (
        "MobileViTModel",
        "MobileViTConfig",
        {"image_size": 32, "hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 32, 64]},
        "image32",
    ),
    "segformer": (
        "SegformerModel",
        "SegformerConfig",
        {
            "hidden_sizes": [8, 16, 24, 32],
            "num_attention_heads": [1, 1, 2, 2],
            "depths": [1, 1, 1, 1],
            "decoder_hidden_size": 32,
        },
        "image32",
    ),
    "pvt_v2": (
        "PvtV2Model",
        "PvtV2Config",
        {"hidden_sizes": [8, 16, 24, 32], "num_attention_heads": [1, 1, 2, 2], "depths": [1, 1, 1, 1]},
        "image32",
    ),
    "yolos": (
        "YolosModel",
        "YolosConfig",
        {
            "image_size": [32, 32],
            "patch_size": 8,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "num_detection_tokens": 4,
        },
        "image32",
    ),
    # convolutional networks
    "resnet": (
        "ResNetModel",
        "ResNetConfig",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]},
        "image32",
    ),
    "regnet": (
        "RegNetModel",
        "RegNetConfig",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "groups_width": 8},
        "image32",
    ),
    "convnext": (
        "ConvNextModel",
        "ConvNextConfig",
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2},
        "image32",
    ),
    "convnextv2": (
        "ConvNextV2Model",
        "ConvNextV2Config",
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2},
        "image32",
    ),
    "mobilenet_v1": ("MobileNetV1Model", "MobileNetV1Config", {"image_size": 32, "depth_multiplier": 0.25}, "image32"),
    "mobilenet_v2": ("MobileNetV2Model", "MobileNetV2Config", {"image_size": 32, "depth_multiplier": 0.25}, "image32"),
    "efficientnet": (
        "EfficientNetModel",
        "EfficientNetConfig",
        {"image_size": 32, "width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320},
        "image32",
    ),
    "bit": ("BitModel", "BitConfig", {"embedding_size": 32, "hidden_sizes": [128, 128], "depths": [1, 1]}, "image32"),
    "poolformer": (
        "PoolFormerModel",
        "PoolFormerConfig",
        {"hidden_sizes": [8, 16, 24, 32], "depths": [1, 1, 1, 1]},
        "image32",
    ),
    "focalnet": (
        "FocalNetModel",
        "FocalNetConfig",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1]},
        "image32",
    ),
    # speech
    "wav2vec2": (
        "Wav2Vec2Model",
        "Wav2Vec2Config",
        _SPEECH,
        "audio",
    ),
    "hubert": (
        "HubertModel",
        "HubertConfig",
        _SPEECH,
        "audio",
    ),
}

LOCAL: dict[str, Callable[[], tuple[nn.Module, list]]] = {
    "mobilenet_v3_small": lambda: (MobileNetV3(), [torch.randn(2, 3, 64, 64)]),
    "deprecated_wrappers": lambda: (DeprecatedWrappers(), [torch.randn(1, 3, 16, 16)]),
}

#: The models of the default suite's sample: one of each family, MobileNetV3 included.
SAMPLE = ("mobilenet_v3_small", "deprecated_wrappers", "bert", "llama", "t5", "vit", "resnet", "efficientnet")


def names() -> list[str]:
    return [*LOCAL, *TRANSFORMERS]


def build(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """The model (random init, eval mode) and its keyword inputs."""
    torch.manual_seed(0)
    if name in LOCAL:
        model, args = LOCAL[name]()
        return model.eval(), {"x": args[0]}
    transformers = importlib.import_module("transformers")
    model_cls, config_cls, config, kind = TRANSFORMERS[name]
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))
    ids = torch.randint(1, 100, (1, 8))
    inputs = {
        "text": {"input_ids": ids},
        "seq2seq": {"input_ids": ids, "decoder_input_ids": ids[:, :4]},
        "image32": {"pixel_values": torch.randn(1, 3, 32, 32)},
        "audio": {"input_values": torch.randn(1, 800)},
    }[kind]
    return model.eval(), inputs


def graphs(name: str) -> list[tuple[torch.fx.GraphModule, list]]:
    """Every graph Dynamo hands a backend for one forward of ``name``; each is run eagerly."""
    model, inputs = build(name)
    seen: list[tuple[torch.fx.GraphModule, list]] = []

    def recording(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=recording)(**inputs)
    finally:
        torch._dynamo.reset()
    return seen
