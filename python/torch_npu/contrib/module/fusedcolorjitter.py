import numbers
import random
import warnings
from math import cos, pi, sin

import numpy as np
import torch

__all__ = ["FusedColorJitter"]


class _FusedColorJitterApply:
    """Brightness, contrast, saturation and hue as one 3x3 colour matrix and an offset: the
    hue rotation and saturation scale are done in YIQ space, folded into RGB."""

    # RGB -> YIQ -> (rotate the chroma by the hue, scale it by the saturation) -> RGB, as
    # const + saturation * cos(h) * sch + saturation * sin(h) * ssh.
    _CONST = np.array([[0.299, 0.299, 0.299], [0.587, 0.587, 0.587], [0.114, 0.114, 0.114]], dtype=np.float32)
    _SCH = np.array([[0.701, -0.299, -0.300], [-0.587, 0.413, -0.588], [-0.114, -0.114, 0.886]], dtype=np.float32)
    _SSH = np.array([[0.168, -0.328, 1.250], [0.330, 0.035, -1.050], [-0.497, 0.292, -0.203]], dtype=np.float32)

    def __init__(self, hue=0.0, saturation=1.0, contrast=0.0, brightness=0.0, is_normalized=False,
                 force_return_array=False):
        self.hue = hue
        self.saturation = saturation
        self.contrast = contrast
        self.brightness = brightness
        self.is_normalized = is_normalized
        self.force_return_array = force_return_array
        self.half_range = 0.5 if is_normalized else 127.5

    def hue_saturation_matrix(self, hue, saturation):
        angle = hue * 255.0 * pi / 180.0
        return self._CONST + saturation * cos(angle) * self._SCH + saturation * sin(angle) * self._SSH

    def get_random_transform_matrix(self, hue=0.05, saturation=0.5, contrast=0.5, brightness=0.125):
        hue = random.uniform(-hue, hue)
        saturation = random.uniform(max(0, 1. - saturation), 1 + saturation)
        contrast = random.uniform(max(0, 1. - contrast), 1 + contrast)
        brightness = random.uniform(max(0, 1. - brightness), 1 + brightness)
        matrix = self.hue_saturation_matrix(hue, saturation) * brightness * contrast
        offset = (1. - contrast) * brightness * self.half_range
        return matrix, offset

    @staticmethod
    def apply_image_transform(img, matrix, offset):
        H, W, C = img.shape
        if C == 4:
            img = img[:, :, :3]
        elif C == 1:
            img = img.repeat(3, axis=-1)
        elif C != 3:
            raise ValueError(f"FusedColorJitter: expected an (H, W, C) image with C in 1, 3 or 4, got shape {img.shape}")
        return (np.matmul(img.reshape(-1, 3), matrix) + offset).reshape(H, W, 3)

    def __call__(self, img):
        matrix, offset = self.get_random_transform_matrix(self.hue, self.saturation, self.contrast, self.brightness)
        try:
            from PIL import Image
        except ImportError:
            Image = None
        return_img = Image is not None and isinstance(img, Image.Image)
        if return_img:
            img = np.asarray(img, dtype=np.float32)
            raw_type = np.uint8
        else:
            if not isinstance(img, np.ndarray) or img.ndim != 3:
                raise TypeError(f"FusedColorJitter: expected a PIL image or an (H, W, C) numpy array, got {type(img)}")
            raw_type = img.dtype
        img = self.apply_image_transform(img, matrix, offset)
        img = img.clip(0., 1. if self.is_normalized else 255.).astype(raw_type)
        if return_img and not self.force_return_array:
            return Image.fromarray(img, mode="RGB")
        return img


class FusedColorJitter(torch.nn.Module):
    """Randomly changes the brightness, contrast, saturation and hue of an image (PIL image or
    (H, W, C) numpy array) with one matrix multiply and add, as torch_npu's.

    Args (as torchvision's ColorJitter): brightness, contrast, saturation: float >= 0 or (min, max);
        hue: float in [0, 0.5] or (min, max) within [-0.5, 0.5].
    As in torch_npu, the transform draws its factors from the arguments as given (numbers; the
    factor for x is uniform in [max(0, 1 - x), 1 + x], the hue in [-hue, hue]), and the class is
    deprecated (a FutureWarning).
    """

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        super().__init__()
        warnings.warn("torch_npu.contrib.module.FusedColorJitter is deprecated. "
                      "Please use torchvision.transforms.ColorJitter as a replacement.", FutureWarning)
        self.brightness = self._check_input(brightness, "brightness")
        self.contrast = self._check_input(contrast, "contrast")
        self.saturation = self._check_input(saturation, "saturation")
        self.hue = self._check_input(hue, "hue", center=0, bound=(-0.5, 0.5), clip_first_on_zero=False)
        # By keyword: torch_npu passes them positionally to the (hue, saturation, contrast,
        # brightness) signature, so its brightness argument jitters the hue; this follows the
        # documented meaning instead.
        self.transformer = _FusedColorJitterApply(hue=hue, saturation=saturation, contrast=contrast,
                                                  brightness=brightness)

    @torch.jit.unused
    def _check_input(self, value, name, center=1, bound=(0, float("inf")), clip_first_on_zero=True):
        if isinstance(value, numbers.Number):
            if value < 0:
                raise ValueError(f"If {name} is a single number, it must be non negative.")
            value = [center - float(value), center + float(value)]
            if clip_first_on_zero:
                value[0] = max(value[0], 0.0)
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            if not bound[0] <= value[0] <= value[1] <= bound[1]:
                raise ValueError(f"{name} values should be between {bound}")
        else:
            raise TypeError(f"{name} should be a single number or a list/tuple with length 2.")
        if value[0] == value[1] == center:
            value = None
        return value

    def forward(self, img):
        return self.transformer(img)

    def __repr__(self):
        return (f"{self.__class__.__name__}(brightness={self.brightness}, contrast={self.contrast}, "
                f"saturation={self.saturation}, hue={self.hue})")
