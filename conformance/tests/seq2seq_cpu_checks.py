"""Ours: the device-against-CPU checks shared by the encoder-decoder models
(EncoderDecoderCpuChecks: T5, BART and Whisper), those of the text ones
(Seq2SeqCpuChecks: T5, BART), and the common tests their EOS-reading
sequence classification head cannot take part in.

A test class mixes one in before ModelTesterMixin and names its classes;
its model tester's prepare_config_and_inputs() returns (config, tensors)
with the encoder's inputs (`encoder_inputs`), decoder_input_ids and
lm_labels (and, for the text models, decoder_attention_mask,
sequence_labels, start_positions and end_positions), and
get_config(**overrides) builds a config.
"""

import torch
from parameterized import parameterized

from transformers.testing_utils import torch_device

from .cpu_reference import ATOL, RTOL, assert_training_matches, on, only, pair
from .test_modeling_common import TEST_EAGER_MATCHES_SDPA_INFERENCE_PARAMETERIZATION, _test_eager_matches_sdpa_inference


class EncoderDecoderCpuChecks:
    base_model_class = None
    conditional_generation_class = None
    # The config overrides that turn dropout off (the name differs by family).
    no_dropout = {}
    # What the encoder reads (Whisper: input_features).
    encoder_inputs = ("input_ids", "attention_mask")

    def _tensors(self, *keys):
        _, t = self.model_tester.prepare_config_and_inputs()
        return self.model_tester.get_config(**self.no_dropout), {k: t[k] for k in keys}

    def test_model_with_cache_matches_cpu(self):
        """The base model with use_cache: the decoder run in two halves (the second
        reading the cache of the first) gives the one-pass result, on the device as
        on the CPU."""
        config, inputs = self._tensors(*self.encoder_inputs, "decoder_input_ids")
        cpu, dev = pair(self.base_model_class, config)
        split = self.model_tester.seq_length // 2
        for model, device in ((cpu, "cpu"), (dev, torch_device)):
            x = on(inputs, device)
            encoder = {k: x[k] for k in self.encoder_inputs}
            mask = {"attention_mask": x["attention_mask"]} if "attention_mask" in x else {}
            with torch.no_grad():
                full = model(**x, use_cache=False).last_hidden_state
                first = model(**encoder, decoder_input_ids=x["decoder_input_ids"][:, :split], use_cache=True)
                second = model(encoder_outputs=(first.encoder_last_hidden_state,), **mask,
                               decoder_input_ids=x["decoder_input_ids"][:, split:],
                               cache=first.cache, use_cache=True)
            stitched = torch.cat([first.last_hidden_state, second.last_hidden_state], dim=1)
            torch.testing.assert_close(stitched.cpu(), full.cpu(), atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"on {device}: {m}")
            if device == "cpu":
                want = full
            else:
                torch.testing.assert_close(full.cpu(), want, atol=ATOL, rtol=RTOL)

    def test_conditional_generation_loss_and_grads_match_cpu(self):
        """The LM head in training mode: the loss from labels (the model shifts them
        into decoder inputs itself) and every parameter's gradient."""
        t = self.model_tester
        config, inputs = self._tensors(*self.encoder_inputs, "lm_labels")
        inputs["labels"] = inputs.pop("lm_labels")
        assert_training_matches(self, self.conditional_generation_class, config, inputs,
                                (t.batch_size, t.seq_length, t.vocab_size))


class Seq2SeqCpuChecks(EncoderDecoderCpuChecks):
    sequence_classification_class = None
    question_answering_class = None

    # --- common tests that do not apply to every head --------------------------

    def _without_sequence_classification(self):
        return only(self, *(c for c in self.all_model_classes if c is not self.sequence_classification_class))

    def test_inputs_embeds(self):
        # The sequence classification head raises NotImplementedError for
        # inputs_embeds: it finds the EOS token in input_ids.
        with self._without_sequence_classification():
            super().test_inputs_embeds()

    @parameterized.expand(TEST_EAGER_MATCHES_SDPA_INFERENCE_PARAMETERIZATION)
    def test_eager_matches_sdpa_inference(
        self, name, dtype, padding_side, use_attention_mask, output_attentions, enable_kernels
    ):
        # The common test pads the batch to 7 rows with random ids in [0, 5),
        # which cannot hold the one EOS per row that the sequence
        # classification head reads its sentence representation from; the
        # other heads run it.
        with self._without_sequence_classification():
            _test_eager_matches_sdpa_inference(
                self, name, dtype, padding_side, use_attention_mask, output_attentions, enable_kernels
            )

    # --- ours: the device against the CPU ------------------------------------

    def test_model_matches_cpu(self):
        """The base model: the encoder's and the decoder's last hidden states, where attended."""
        t = self.model_tester
        config, inputs = self._tensors("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
        cpu, dev = pair(self.base_model_class, config)
        with torch.no_grad():
            got = dev(**on(inputs, torch_device))
            want = cpu(**on(inputs, "cpu"))
        self.assertEqual(got.last_hidden_state.device.type, torch.device(torch_device).type)
        self.assertEqual(got.last_hidden_state.shape, (t.batch_size, t.seq_length, t.hidden_size))
        enc_keep = inputs["attention_mask"].cpu().bool()
        dec_keep = inputs["decoder_attention_mask"].cpu().bool()
        torch.testing.assert_close(got.encoder_last_hidden_state.cpu()[enc_keep],
                                   want.encoder_last_hidden_state[enc_keep], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.last_hidden_state.cpu()[dec_keep], want.last_hidden_state[dec_keep],
                                   atol=ATOL, rtol=RTOL)

    def test_sequence_classification_matches_cpu(self):
        t = self.model_tester
        config, inputs = self._tensors("input_ids", "attention_mask", "sequence_labels")
        inputs["labels"] = inputs.pop("sequence_labels")
        cpu, dev = pair(self.sequence_classification_class, config)
        with torch.no_grad():
            got = dev(**on(inputs, torch_device))
            want = cpu(**on(inputs, "cpu"))
        self.assertEqual(got.logits.shape, (t.batch_size, t.num_labels))
        torch.testing.assert_close(got.logits.cpu(), want.logits, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=ATOL, rtol=RTOL)

    def test_question_answering_matches_cpu(self):
        t = self.model_tester
        config, inputs = self._tensors("input_ids", "attention_mask", "start_positions", "end_positions")
        cpu, dev = pair(self.question_answering_class, config)
        with torch.no_grad():
            got = dev(**on(inputs, torch_device))
            want = cpu(**on(inputs, "cpu"))
        self.assertEqual(got.start_logits.shape, (t.batch_size, t.seq_length))
        torch.testing.assert_close(got.start_logits.cpu(), want.start_logits, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.end_logits.cpu(), want.end_logits, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=ATOL, rtol=RTOL)
