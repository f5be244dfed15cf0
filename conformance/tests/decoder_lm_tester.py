"""Ours: the tester shared by the decoder-only language models (Llama,
Mistral, Qwen3, Qwen3-MoE, Gemma). A model's test file names its classes
and any config fields of its own; the tests come from transformers'
ModelTesterMixin (the sdist), our GenerationTesterMixin, and the checks
below, each of which compares the test device with the CPU."""


import torch

from transformers.testing_utils import torch_device

from .test_configuration_common import ConfigTester
from .test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask
from .cpu_reference import assert_training_matches, pair
from .generation.test_utils import GenerationTesterMixin


class DecoderModelTester:
    config_class = None
    base_model_class = None
    causal_lm_class = None
    sequence_classification_class = None
    token_classification_class = None
    question_answering_class = None

    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        is_training=True,
        use_input_mask=True,
        use_labels=True,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        hidden_act="silu",
        max_position_embeddings=64,
        num_labels=3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **config_extra,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_input_mask = use_input_mask
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.head_dim = hidden_size // num_attention_heads
        self.config_extra = config_extra

    @classmethod
    def all_classes(cls):
        """The model classes that exist for this family, base model first."""
        return tuple(
            c
            for c in (
                cls.base_model_class,
                cls.causal_lm_class,
                cls.sequence_classification_class,
                cls.token_classification_class,
                cls.question_answering_class,
            )
            if c is not None
        )

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            max_position_embeddings=self.max_position_embeddings,
            head_dim=self.head_dim,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            **self.config_extra,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        input_mask = random_attention_mask([self.batch_size, self.seq_length]) if self.use_input_mask else None
        sequence_labels = token_labels = None
        if self.use_labels:
            sequence_labels = ids_tensor([self.batch_size], self.num_labels)
            token_labels = ids_tensor([self.batch_size, self.seq_length], self.num_labels)
        return self.get_config(), input_ids, input_mask, sequence_labels, token_labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, input_mask, _, _ = self.prepare_config_and_inputs()
        inputs = {"input_ids": input_ids}
        if input_mask is not None:
            inputs["attention_mask"] = input_mask
        return config, inputs


class DecoderModelTest(ModelTesterMixin, GenerationTesterMixin):
    """Base of a decoder-only model's test class (add unittest.TestCase and
    set all_model_classes = <Tester>.all_classes())."""

    model_tester_class = None
    test_pruning = False

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(
            self, config_class=self.model_tester_class.config_class, hidden_size=48, num_attention_heads=4
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def _pair(self, model_class, config):
        return pair(model_class, config)

    def test_model_matches_cpu(self):
        """The base model's last hidden state, masked, against the CPU's."""
        t = self.model_tester
        config, input_ids, mask, _, _ = t.prepare_config_and_inputs()
        cpu, dev = self._pair(t.base_model_class, config)
        with torch.no_grad():
            got = dev(input_ids=input_ids.to(torch_device), attention_mask=mask.to(torch_device)).last_hidden_state
            want = cpu(input_ids=input_ids.cpu(), attention_mask=mask.cpu()).last_hidden_state
        self.assertEqual(got.shape, (t.batch_size, t.seq_length, t.hidden_size))
        self.assertEqual(got.device.type, torch.device(torch_device).type)
        keep = mask.cpu().bool()
        torch.testing.assert_close(got.cpu()[keep], want[keep], atol=1e-4, rtol=1e-4)

    def test_causal_lm_loss_and_grads_match_cpu(self):
        """Loss and every parameter's gradient after one backward, against the CPU."""
        t = self.model_tester
        config, input_ids, mask, _, _ = t.prepare_config_and_inputs()
        assert_training_matches(self, t.causal_lm_class, config,
                                {"input_ids": input_ids, "attention_mask": mask, "labels": input_ids})

    def test_sequence_classification_matches_cpu(self):
        t = self.model_tester
        if t.sequence_classification_class is None:
            self.skipTest("no sequence classification head")
        config, input_ids, mask, labels, _ = t.prepare_config_and_inputs()
        cpu, dev = self._pair(t.sequence_classification_class, config)
        with torch.no_grad():
            got = dev(input_ids=input_ids.to(torch_device), attention_mask=mask.to(torch_device),
                      labels=labels.to(torch_device))
            want = cpu(input_ids=input_ids.cpu(), attention_mask=mask.cpu(), labels=labels.cpu())
        self.assertEqual(got.logits.shape, (t.batch_size, t.num_labels))
        torch.testing.assert_close(got.logits.cpu(), want.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=1e-4, rtol=1e-4)
