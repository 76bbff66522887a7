"""``FeatureManager``: which profiling features this torch_npu and the installed CANN agree on,
as torch_npu's (a singleton). ``load_feature_info(info)`` takes CANN's feature table (feature
name -> ``affectedComponent``, ``affectedComponentVersion``, ``featureVersion``,
``compatibility``, ``infoLog``). ``is_supported_feature(name)``: the feature must concern
torch_npu (component ``PTA`` or ``all``, version ``all`` or this one); with equal feature
versions it is supported, otherwise the newer side's ``compatibility`` flag decides."""
from ._constant import Constant
from ._singleton import Singleton

__all__ = []


class FeatureName:
    ATTR = "ATTR"


@Singleton
class FeatureManager:
    ALL = "all"
    PTA = "PTA"
    YES = "1"
    No = "0"

    def __init__(self) -> None:
        self.version = "master"
        self.fmkFeature = {}
        self.cannFeature = {}
        self._init_fmk_feature()

    def _init_fmk_feature(self):
        self.fmkFeature.setdefault(FeatureName.ATTR, {Constant.FeatureVersion: "0", Constant.Compatibility: self.YES})

    def load_feature_info(self, feature_info: dict):
        if not isinstance(feature_info, dict):
            raise TypeError(f"load_feature_info: feature_info must be a dict, got {type(feature_info).__name__}")
        self.cannFeature = feature_info

    def is_supported_feature(self, feature_name: str) -> bool:
        cann = self.cannFeature.get(feature_name, {})
        if cann.get(Constant.AffectedComponent, "") not in (self.ALL, self.PTA):
            return False
        if cann.get(Constant.AffectedComponentVersion, "") not in (self.ALL, self.version):
            return False
        ours = self.fmkFeature.get(feature_name, {})
        our_version = str(ours.get(Constant.FeatureVersion, "0"))
        cann_version = str(cann.get(Constant.FeatureVersion, "0"))
        if not (our_version.isdigit() and cann_version.isdigit()):
            return False
        if int(our_version) > int(cann_version):
            return ours.get(Constant.Compatibility, self.No) == self.YES
        if int(our_version) < int(cann_version):
            return cann.get(Constant.Compatibility, self.No) == self.YES
        return True

    def clear(self):
        self.cannFeature.clear()
