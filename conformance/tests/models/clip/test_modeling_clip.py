"""CLIP on the test device: transformers' common model tests and checks
against the same model on the CPU (the parity checks are BERT's, from
tests/models/bert/), for

- CLIPTextModelTest: CLIPTextModel, CLIPTextModelWithProjection (CLIPTextConfig);
- CLIPVisionModelTest: CLIPVisionModel, CLIPVisionModelWithProjection (CLIPVisionConfig);
- CLIPModelTest: CLIPModel, the dual encoder with its contrastive loss
  (CLIPConfig with text and vision sub-configs: a composite model);
- CLIPForImageClassificationTest: the vision tower with a classifier (CLIPConfig).
"""

import unittest

import torch

from transformers import (
    CLIPConfig,
    CLIPForImageClassification,
    CLIPModel,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
)
from transformers.testing_utils import torch_device

from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor
from ..bert.test_modeling_bert import ATOL, RTOL, CpuParityChecks, to_device


class CLIPTextModelTester:
    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        # The towers have no loss, so the mixin's training tests have nothing to train; the
        # gradients are compared with the CPU's in test_loss_and_grads_match_cpu all the same.
        is_training=False,
        use_input_mask=True,
        vocab_size=99,
        hidden_size=32,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        attention_dropout=0.0,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=3,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_input_mask = use_input_mask
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.projection_dim = projection_dim
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.attention_dropout = attention_dropout
        self.max_position_embeddings = max_position_embeddings
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        # Not 2: with eos_token_id == 2 CLIP pools at the largest token id (its legacy rule);
        # any other id pools at the first eos, as real tokenized text has it.
        self.eos_token_id = eos_token_id

    def get_config(self):
        return CLIPTextConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            projection_dim=self.projection_dim,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            attention_dropout=self.attention_dropout,
            max_position_embeddings=self.max_position_embeddings,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self):
        """Right-padded text as a tokenizer makes it: tokens, the eos token at the end of each
        row, pad tokens after it (masked out). The first row is full length."""
        b, s = self.batch_size, self.seq_length
        special = max(self.pad_token_id, self.bos_token_id, self.eos_token_id) + 1
        input_ids = (ids_tensor([b, s], self.vocab_size - special).cpu() + special)
        lengths = ids_tensor([b], s).cpu() + 1
        lengths[0] = s
        positions = torch.arange(s).unsqueeze(0)
        mask = (positions < lengths.unsqueeze(1)).long()
        input_ids = torch.where(positions == (lengths - 1).unsqueeze(1), self.eos_token_id, input_ids)
        input_ids = torch.where(mask.bool(), input_ids, self.pad_token_id)
        if not self.use_input_mask:
            mask = None
        else:
            mask = mask.to(torch_device)
        return self.get_config(), input_ids.to(torch_device), mask

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, mask = self.prepare_config_and_inputs()
        inputs = {"input_ids": input_ids}
        if mask is not None:
            inputs["attention_mask"] = mask
        return config, inputs


class CLIPVisionModelTester:
    def __init__(
        self,
        parent,
        batch_size=3,
        image_size=30,
        patch_size=2,
        num_channels=3,
        is_training=False,  # no loss, as for the text tower
        hidden_size=32,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        attention_dropout=0.0,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.is_training = is_training
        self.hidden_size = hidden_size
        self.projection_dim = projection_dim
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.attention_dropout = attention_dropout
        # A token per patch and the class token.
        self.num_patches = (image_size // patch_size) ** 2
        self.seq_length = self.num_patches + 1

    def get_config(self):
        return CLIPVisionConfig(
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            projection_dim=self.projection_dim,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            attention_dropout=self.attention_dropout,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), pixel_values

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}


class CLIPModelTester:
    """Texts and images in the same number, for CLIPModel (and, images only, the classifier)."""

    def __init__(self, parent, is_training=True, projection_dim=32, num_labels=3, text_kwargs=None,
                 vision_kwargs=None):
        self.parent = parent
        self.text_model_tester = CLIPTextModelTester(parent, **(text_kwargs or {}))
        self.vision_model_tester = CLIPVisionModelTester(parent, **(vision_kwargs or {}))
        self.batch_size = self.text_model_tester.batch_size
        self.is_training = is_training
        self.projection_dim = projection_dim
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        # The vision tower's geometry, for the mixin's image-classification labels.
        self.image_size = self.vision_model_tester.image_size
        self.patch_size = self.vision_model_tester.patch_size

    def get_config(self):
        return CLIPConfig(
            text_config=self.text_model_tester.get_config().to_dict(),
            vision_config=self.vision_model_tester.get_config().to_dict(),
            projection_dim=self.projection_dim,
            num_labels=self.num_labels,
        )

    def prepare_config_and_inputs(self):
        _, input_ids, mask = self.text_model_tester.prepare_config_and_inputs()
        _, pixel_values = self.vision_model_tester.prepare_config_and_inputs()
        return self.get_config(), input_ids, mask, pixel_values

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, mask, pixel_values = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": mask, "pixel_values": pixel_values,
                        "return_loss": True}


class CLIPImageClassificationTester(CLIPModelTester):
    """Images only: the classifier runs the vision tower alone."""

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        v = self.vision_model_tester
        self.num_hidden_layers = v.num_hidden_layers
        self.num_attention_heads = v.num_attention_heads
        self.hidden_size = v.hidden_size
        self.seq_length = v.seq_length

    def prepare_config_and_inputs_for_common(self):
        config, _, _, pixel_values = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}


# --- the tower models --------------------------------------------------------------------------


class CLIPTextModelTest(ModelTesterMixin, CpuParityChecks, unittest.TestCase):
    all_model_classes = (CLIPTextModel, CLIPTextModelWithProjection)
    test_pruning = False

    def setUp(self):
        self.model_tester = CLIPTextModelTester(self)
        self.config_tester = ConfigTester(self, config_class=CLIPTextConfig, hidden_size=48, num_attention_heads=4)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_pooled_output_is_the_eos_state(self):
        """The pooled output is the final state at each row's eos token, on the device as on the CPU."""
        t = self.model_tester
        config, input_ids, mask = t.prepare_config_and_inputs()
        cpu, dev = self._cpu_and_device(CLIPTextModel, config)
        kwargs = {"input_ids": input_ids, "attention_mask": mask}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        eos_at = (input_ids.cpu() == t.eos_token_id).int().argmax(-1)
        rows = torch.arange(t.batch_size)
        torch.testing.assert_close(got.pooler_output.cpu(), got.last_hidden_state.cpu()[rows, eos_at])
        torch.testing.assert_close(got.pooler_output.cpu(), want.pooler_output, atol=ATOL, rtol=RTOL)


class CLIPVisionModelTest(ModelTesterMixin, CpuParityChecks, unittest.TestCase):
    all_model_classes = (CLIPVisionModel, CLIPVisionModelWithProjection)
    test_pruning = False
    # Patch embeddings, not token embeddings: nothing to resize.
    test_resize_embeddings = False

    def setUp(self):
        self.model_tester = CLIPVisionModelTester(self)
        self.config_tester = ConfigTester(self, config_class=CLIPVisionConfig, has_text_modality=False,
                                          hidden_size=48, num_attention_heads=4)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model_get_set_embeddings(self):
        # The input embeddings are a patch convolution, not the nn.Embedding the mixin's version
        # of this test expects; there are no output embeddings.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
            self.assertIsNone(model.get_output_embeddings())

    def test_interpolate_pos_encoding_matches_cpu(self):
        """A larger image than the config's, with the position embeddings interpolated (bicubic)."""
        t = self.model_tester
        config, _ = t.prepare_config_and_inputs()
        size = t.image_size + 2 * t.patch_size
        pixel_values = floats_tensor([t.batch_size, t.num_channels, size, size])
        cpu, dev = self._cpu_and_device(CLIPVisionModel, config)
        with torch.no_grad():
            got = dev(pixel_values=pixel_values.to(torch_device), interpolate_pos_encoding=True)
            want = cpu(pixel_values=pixel_values.cpu(), interpolate_pos_encoding=True)
        self.assertEqual(got.last_hidden_state.shape, (t.batch_size, (size // t.patch_size) ** 2 + 1, t.hidden_size))
        torch.testing.assert_close(got.last_hidden_state.cpu(), want.last_hidden_state, atol=ATOL, rtol=RTOL)


# --- the composite models ----------------------------------------------------------------------


class CLIPModelTest(ModelTesterMixin, CpuParityChecks, unittest.TestCase):
    all_model_classes = (CLIPModel,)
    _is_composite = True
    test_pruning = False
    test_resize_embeddings = False
    # The eager/SDPA comparison feeds the main input (input_ids) and these.
    additional_model_inputs = ["pixel_values"]

    def setUp(self):
        self.model_tester = CLIPModelTester(self)
        self.config_tester = ConfigTester(self, config_class=CLIPConfig, has_text_modality=False,
                                          common_properties=["projection_dim", "logit_scale_init_value"])

    def test_config(self):
        self.config_tester.run_common_tests()

    # CLIPOutput has no top-level hidden states or attentions: each tower's are in
    # text_model_output and vision_model_output. These replace the mixin's versions, which look
    # at the top level, with the same checks made on the towers' outputs.

    def _tower_outputs(self, **flags):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        model = CLIPModel(config).to(torch_device).eval()
        if flags.get("output_attentions"):
            model.set_attn_implementation("eager")
        with torch.no_grad():
            out = model(**inputs, **flags)
        return out.text_model_output, out.vision_model_output

    def test_hidden_states_output(self):
        t = self.model_tester
        text, vision = self._tower_outputs(output_hidden_states=True)
        for out, tester in ((text, t.text_model_tester), (vision, t.vision_model_tester)):
            self.assertEqual(len(out.hidden_states), tester.num_hidden_layers + 1)
            for h in out.hidden_states:
                self.assertEqual(tuple(h.shape), (tester.batch_size, tester.seq_length, tester.hidden_size))

    def test_attention_outputs(self):
        t = self.model_tester
        text, vision = self._tower_outputs(output_attentions=True)
        for out, tester in ((text, t.text_model_tester), (vision, t.vision_model_tester)):
            self.assertEqual(len(out.attentions), tester.num_hidden_layers)
            for a in out.attentions:
                self.assertEqual(tuple(a.shape), (tester.batch_size, tester.num_attention_heads,
                                                  tester.seq_length, tester.seq_length))
                rows = a.sum(-1).cpu()
                torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=1e-5)

    def test_retain_grad_hidden_states_attentions(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        model = CLIPModel(config).to(torch_device)
        model.set_attn_implementation("eager")
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        kept = [out.text_model_output.hidden_states[0], out.text_model_output.attentions[0],
                out.vision_model_output.hidden_states[0], out.vision_model_output.attentions[0]]
        for x in kept:
            x.retain_grad()
        out.loss.backward()
        for i, x in enumerate(kept):
            self.assertIsNotNone(x.grad, f"retained tensor {i} has no gradient")

    def test_model_get_set_embeddings(self):
        # CLIPModel has no single input embedding; each tower has its own.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        model = CLIPModel(config)
        self.assertIsInstance(model.text_model.get_input_embeddings(), torch.nn.Embedding)
        self.assertIsInstance(model.vision_model.get_input_embeddings(), torch.nn.Module)
        new = torch.nn.Embedding(10, config.text_config.hidden_size)
        model.text_model.set_input_embeddings(new)
        self.assertIs(model.text_model.get_input_embeddings(), new)

    def test_logits_and_contrastive_loss_match_cpu(self):
        t = self.model_tester
        config, input_ids, mask, pixel_values = t.prepare_config_and_inputs()
        cpu, dev = self._cpu_and_device(CLIPModel, config)
        kwargs = {"input_ids": input_ids, "attention_mask": mask, "pixel_values": pixel_values, "return_loss": True}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        n_img = t.vision_model_tester.batch_size
        self.assertEqual(got.logits_per_image.shape, (n_img, t.text_model_tester.batch_size))
        torch.testing.assert_close(got.logits_per_image.cpu(), got.logits_per_text.cpu().t())
        for name in ("logits_per_image", "text_embeds", "image_embeds", "loss"):
            torch.testing.assert_close(getattr(got, name).cpu(), getattr(want, name), atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"{name}: {m}")
        # The embeddings are unit vectors.
        torch.testing.assert_close(got.text_embeds.norm(dim=-1).cpu(), torch.ones(t.batch_size))

    def test_text_and_image_features_match_cpu(self):
        t = self.model_tester
        config, input_ids, mask, pixel_values = t.prepare_config_and_inputs()
        cpu, dev = self._cpu_and_device(CLIPModel, config)
        with torch.no_grad():
            got_t = dev.get_text_features(input_ids=input_ids.to(torch_device), attention_mask=mask.to(torch_device))
            want_t = cpu.get_text_features(input_ids=input_ids.cpu(), attention_mask=mask.cpu())
            got_i = dev.get_image_features(pixel_values=pixel_values.to(torch_device))
            want_i = cpu.get_image_features(pixel_values=pixel_values.cpu())
        self.assertEqual(got_t.pooler_output.shape, (t.batch_size, t.projection_dim))
        self.assertEqual(got_i.pooler_output.shape, (t.vision_model_tester.batch_size, t.projection_dim))
        torch.testing.assert_close(got_t.pooler_output.cpu(), want_t.pooler_output, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got_i.pooler_output.cpu(), want_i.pooler_output, atol=ATOL, rtol=RTOL)


class CLIPForImageClassificationTest(ModelTesterMixin, CpuParityChecks, unittest.TestCase):
    all_model_classes = (CLIPForImageClassification,)
    _is_composite = True
    test_pruning = False
    test_resize_embeddings = False
    # The classifier averages the patch states of the tower's last layer and never uses the
    # tower's pooled output, so vision_model.post_layernorm gets no gradient (by design).
    test_all_params_have_gradient = False

    def setUp(self):
        self.model_tester = CLIPImageClassificationTester(self)

    def test_model_get_set_embeddings(self):
        # The classifier's input embeddings are its vision tower's patch convolution.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        model = CLIPForImageClassification(config)
        self.assertIsInstance(model.vision_model.get_input_embeddings(), torch.nn.Module)
        self.assertIsNone(model.get_output_embeddings())

    def test_classification_matches_cpu(self):
        t = self.model_tester
        config, _, _, pixel_values = t.prepare_config_and_inputs()
        labels = ids_tensor([t.batch_size], t.num_labels)
        cpu, dev = self._cpu_and_device(CLIPForImageClassification, config)
        kwargs = {"pixel_values": pixel_values, "labels": labels}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        self.assertEqual(got.logits.shape, (t.batch_size, t.num_labels))
        torch.testing.assert_close(got.logits.cpu(), want.logits, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=ATOL, rtol=RTOL)
