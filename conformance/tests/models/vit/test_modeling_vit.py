"""ViT on the test device: transformers' common model tests and checks of
every head against the same model on the CPU (the parity checks are
BERT's, from tests/models/bert/)."""

import unittest

import torch

from transformers import ViTConfig, ViTForImageClassification, ViTForMaskedImageModeling, ViTModel
from transformers.testing_utils import torch_device

from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor
from ..bert.test_modeling_bert import ATOL, RTOL, CpuParityChecks, to_device


class ViTModelTester:
    def __init__(
        self,
        parent,
        batch_size=3,
        image_size=30,
        patch_size=2,
        num_channels=3,
        is_training=True,
        use_labels=True,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_labels=3,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.is_training = is_training
        self.use_labels = use_labels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        # A token per patch and the [CLS] token.
        self.num_patches = (image_size // patch_size) ** 2
        self.seq_length = self.num_patches + 1
        # For the mixin's eager/SDPA comparison, which masks the first num_masks of
        # mask_length patches (bool_masked_pos covers the patches, not [CLS]).
        self.mask_length = self.num_patches
        self.num_masks = 5

    def get_config(self):
        return ViTConfig(
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            # Masked image modeling needs the decoder's stride equal to the patch size.
            encoder_stride=self.patch_size,
            num_labels=self.num_labels,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.type_sequence_label_size) if self.use_labels else None
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}


class ViTModelTest(ModelTesterMixin, CpuParityChecks, unittest.TestCase):
    all_model_classes = (ViTModel, ViTForImageClassification, ViTForMaskedImageModeling)
    test_pruning = False
    # Patch embeddings, not token embeddings: nothing to resize.
    test_resize_embeddings = False

    def setUp(self):
        self.model_tester = ViTModelTester(self)
        self.config_tester = ConfigTester(self, config_class=ViTConfig, has_text_modality=False, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model_get_set_embeddings(self):
        # The input embeddings are a patch projection, not an nn.Embedding as the mixin's version
        # of this test expects; ViT has no output embeddings.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
            self.assertIsNone(model.get_output_embeddings())

    def test_image_classification_matches_cpu(self):
        t = self.model_tester
        config, pixel_values, labels = t.prepare_config_and_inputs()
        cpu, dev = self._cpu_and_device(ViTForImageClassification, config)
        kwargs = {"pixel_values": pixel_values, "labels": labels}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        self.assertEqual(got.logits.shape, (t.batch_size, t.num_labels))
        torch.testing.assert_close(got.logits.cpu(), want.logits, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=ATOL, rtol=RTOL)

    def test_masked_image_modeling_with_random_mask_matches_cpu(self):
        """Reconstruction and its masked L1 loss with about half of the patches masked."""
        t = self.model_tester
        config, pixel_values, _ = t.prepare_config_and_inputs()
        bool_masked_pos = ids_tensor([t.batch_size, t.num_patches], 2).bool()
        cpu, dev = self._cpu_and_device(ViTForMaskedImageModeling, config)
        kwargs = {"pixel_values": pixel_values, "bool_masked_pos": bool_masked_pos}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        self.assertEqual(got.reconstruction.shape, (t.batch_size, t.num_channels, t.image_size, t.image_size))
        torch.testing.assert_close(got.reconstruction.cpu(), want.reconstruction, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=ATOL, rtol=RTOL)

    def test_interpolate_pos_encoding_matches_cpu(self):
        """A larger image than the config's, with the position embeddings interpolated (bicubic)."""
        t = self.model_tester
        config, _, _ = t.prepare_config_and_inputs()
        size = t.image_size + 2 * t.patch_size
        pixel_values = floats_tensor([t.batch_size, t.num_channels, size, size])
        cpu, dev = self._cpu_and_device(ViTModel, config)
        with torch.no_grad():
            got = dev(pixel_values=pixel_values.to(torch_device), interpolate_pos_encoding=True)
            want = cpu(pixel_values=pixel_values.cpu(), interpolate_pos_encoding=True)
        self.assertEqual(got.last_hidden_state.shape, (t.batch_size, (size // t.patch_size) ** 2 + 1, t.hidden_size))
        torch.testing.assert_close(got.last_hidden_state.cpu(), want.last_hidden_state, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.pooler_output.cpu(), want.pooler_output, atol=ATOL, rtol=RTOL)
