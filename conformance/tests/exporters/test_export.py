"""Ours, in place of transformers' tests/exporters/test_export.py, which the
sdist does not carry and test_modeling_common.py imports (ModelTesterMixin
derives from ExportTesterMixin).

test_torch_export: each model class exports with torch.export (non-strict)
from inputs on the test device, and the exported program run on the device
gives the eager model's outputs."""

import copy

import pytest
import torch

from transformers import set_seed
from transformers.testing_utils import torch_device


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict) or hasattr(x, "to_tuple"):
        x = x.values() if isinstance(x, dict) else x.to_tuple()
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


class ExportTesterMixin:
    test_torch_exportable = True

    @pytest.mark.torch_export_test
    def test_torch_export(self):
        if not self.test_torch_exportable:
            self.skipTest(f"{type(self).__name__} sets test_torch_exportable = False")
        for model_class in self.all_model_classes:
            config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
            config = copy.deepcopy(config)
            config.use_cache = False
            set_seed(0)
            model = model_class(config).to(torch_device).eval()
            inputs = self._prepare_for_class(inputs, model_class)
            inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            with torch.no_grad():
                eager = _tensors(model(**inputs))
                program = torch.export.export(model, args=(), kwargs=inputs, strict=False)
                exported = _tensors(program.module()(**inputs))
            self.assertEqual(len(exported), len(eager), f"{model_class.__name__}: output count")
            for i, (a, b) in enumerate(zip(exported, eager)):
                self.assertEqual(a.device.type, torch.device(torch_device).type)
                torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-4, rtol=1e-4,
                                           msg=lambda m: f"{model_class.__name__} output {i}: {m}")
