"""Ours, in place of transformers' tests/generation/test_utils.py, which the
sdist does not carry and test_modeling_common.py imports.

GenerationTesterMixin checks `generate()` on the test device against the
same model on the CPU, for every generative class of a model test:

- greedy search: the logits of each step equal the CPU's within tolerance
  while the two sequences agree, and where they part the CPU's top two
  logits were a near tie (so a different argmax is rounding, not a bug);
- the same with the KV cache off, and with a static cache, against the
  dynamic cache on the device;
- sampling: reproducible from a seed on the device, tokens in range;
- beam search: shapes, scores finite, the best beam equal to the CPU's when
  its score is not a near tie;
- dict outputs: scores, logits, hidden states and attentions per step;
- left padding: the next-token logits of a left-padded row equal those of
  the same row unpadded (decoder-only models);
- inputs_embeds: generation from embeddings continues as from ids.
"""

import copy
import inspect
import unittest

import pytest
import torch

from transformers.testing_utils import torch_device

from ..cpu_reference import on, pair

# Inputs `generate()` takes besides the prompt ids (per modality).
_GENERATE_INPUTS = (
    "input_ids",
    "attention_mask",
    "pixel_values",
    "input_features",
    "input_values",
    "token_type_ids",
)
ATOL = 1e-4
RTOL = 1e-4
NEW_TOKENS = 4


class GenerationTesterMixin:
    # model_tester and all_generative_model_classes come from ModelTesterMixin.
    max_new_tokens = NEW_TOKENS

    # --- helpers -------------------------------------------------------------

    def _generation_setup(self, model_class):
        """(config, inputs) for generate(): the tester's inputs without labels
        or decoder inputs, and a config that never stops early."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        accepted = set(inspect.signature(model_class.forward).parameters)
        inputs = {k: v for k, v in inputs.items() if k in _GENERATE_INPUTS and k in accepted}
        if "input_ids" in inputs:
            inputs["input_ids"] = inputs["input_ids"][:2]
            if "attention_mask" in inputs:
                inputs["attention_mask"] = inputs["attention_mask"][:2]
            if "token_type_ids" in inputs:
                inputs["token_type_ids"] = inputs["token_type_ids"][:2]
        else:
            inputs = {k: v[:2] for k, v in inputs.items()}
        config.use_cache = True
        # The tester makes its tensors on the test device; the reference runs on the CPU.
        return config, self._on(inputs, "cpu")

    def _gen_kwargs(self, config, **extra):
        pad = getattr(config, "pad_token_id", None)
        if pad is None:
            pad = 0
        kw = {
            "max_new_tokens": self.max_new_tokens,
            "min_new_tokens": self.max_new_tokens,
            "eos_token_id": None,
            "pad_token_id": pad,
            "do_sample": False,
            "num_beams": 1,
        }
        kw.update(extra)
        return kw

    def _pair(self, model_class, config):
        return pair(model_class, config)

    @staticmethod
    def _on(inputs, device):
        return on(inputs, device)

    def _assert_steps_match(self, dev_out, cpu_out, prompt_len):
        """Greedy steps: logits agree while the sequences agree; a parting is a near tie."""
        dev_seq = dev_out.sequences.cpu()
        cpu_seq = cpu_out.sequences.cpu()
        self.assertEqual(dev_seq.shape, cpu_seq.shape)
        self.assertEqual(len(dev_out.logits), len(cpu_out.logits))
        for row in range(cpu_seq.shape[0]):
            for step, (dl, cl) in enumerate(zip(dev_out.logits, cpu_out.logits)):
                d = dl[row].float().cpu()
                c = cl[row].float()
                torch.testing.assert_close(d, c, atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"row {row}, step {step}: {m}")
                pos = prompt_len + step
                if dev_seq[row, pos] != cpu_seq[row, pos]:
                    top2 = torch.topk(c, 2).values
                    self.assertLess(float(top2[0] - top2[1]), 10 * ATOL,
                                    f"row {row}, step {step}: tokens differ without a near tie")
                    break

    def _prompt_len(self, model, inputs):
        if model.config.is_encoder_decoder:
            return 1  # the decoder starts from its start token
        return inputs["input_ids"].shape[-1]

    # --- the checks ----------------------------------------------------------

    @pytest.mark.generate
    def test_greedy_generate_matches_cpu(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            cpu_model, dev_model = self._pair(model_class, config)
            kw = self._gen_kwargs(config, return_dict_in_generate=True, output_logits=True)
            cpu_out = cpu_model.generate(**inputs, **kw)
            dev_out = dev_model.generate(**self._on(inputs, torch_device), **kw)
            self.assertEqual(dev_out.sequences.device.type, torch.device(torch_device).type)
            self.assertEqual(len(dev_out.logits), self.max_new_tokens)
            self._assert_steps_match(dev_out, cpu_out, self._prompt_len(cpu_model, inputs))

    @pytest.mark.generate
    def test_greedy_generate_without_cache(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            _, model = self._pair(model_class, config)
            inputs = self._on(inputs, torch_device)
            kw = self._gen_kwargs(config, return_dict_in_generate=True, output_logits=True)
            with_cache = model.generate(**inputs, use_cache=True, **kw)
            without = model.generate(**inputs, use_cache=False, **kw)
            self._assert_steps_match(without, _cpu_view(with_cache), self._prompt_len(model, inputs))

    @pytest.mark.generate
    def test_greedy_generate_static_cache(self):
        for model_class in self.all_generative_model_classes:
            if not getattr(model_class, "_can_compile_fullgraph", False):
                self.skipTest(f"{model_class.__name__} does not support a static cache")
            config, inputs = self._generation_setup(model_class)
            _, model = self._pair(model_class, config)
            inputs = self._on(inputs, torch_device)
            kw = self._gen_kwargs(config, return_dict_in_generate=True, output_logits=True)
            dynamic = model.generate(**inputs, **kw)
            static = model.generate(**inputs, cache_implementation="static", **kw)
            self._assert_steps_match(static, _cpu_view(dynamic), self._prompt_len(model, inputs))

    @pytest.mark.generate
    def test_sample_generate_reproducible(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            _, model = self._pair(model_class, config)
            inputs = self._on(inputs, torch_device)
            kw = self._gen_kwargs(config, do_sample=True, top_k=0, temperature=1.0)
            torch.manual_seed(1234)
            first = model.generate(**inputs, **kw)
            torch.manual_seed(1234)
            second = model.generate(**inputs, **kw)
            self.assertEqual(first.device.type, torch.device(torch_device).type)
            torch.testing.assert_close(first.cpu(), second.cpu(), atol=0, rtol=0)
            vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None \
                else config.get_text_config().vocab_size
            self.assertTrue(bool((first >= 0).all()) and bool((first < vocab).all()))

    @pytest.mark.generate
    def test_beam_search_generate(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            cpu_model, dev_model = self._pair(model_class, config)
            kw = self._gen_kwargs(config, num_beams=2, num_return_sequences=2, return_dict_in_generate=True,
                                  output_scores=True)
            cpu_out = cpu_model.generate(**inputs, **kw)
            dev_out = dev_model.generate(**self._on(inputs, torch_device), **kw)
            batch = next(iter(inputs.values())).shape[0]
            self.assertEqual(dev_out.sequences.shape[0], batch * 2)
            self.assertEqual(dev_out.sequences.shape, cpu_out.sequences.shape)
            scores = dev_out.sequences_scores.cpu()
            self.assertTrue(bool(torch.isfinite(scores).all()))
            # The best beam's score matches the CPU's; the tokens too unless
            # two beams score within rounding of each other.
            cpu_scores = cpu_out.sequences_scores.view(batch, 2)
            torch.testing.assert_close(scores.view(batch, 2)[:, 0], cpu_scores[:, 0], atol=1e-3, rtol=1e-3)
            for b in range(batch):
                if float(cpu_scores[b, 0] - cpu_scores[b, 1]) > 1e-3:
                    self.assertEqual(dev_out.sequences.cpu()[2 * b].tolist(), cpu_out.sequences[2 * b].tolist())

    @pytest.mark.generate
    def test_generate_dict_outputs(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            _, model = self._pair(model_class, config)
            inputs = self._on(inputs, torch_device)
            kw = self._gen_kwargs(config, return_dict_in_generate=True, output_scores=True, output_logits=True,
                                  output_hidden_states=True,
                                  output_attentions=getattr(self, "has_attentions", True))
            if kw["output_attentions"] and "output_attentions" in inspect.signature(model.forward).parameters:
                model.set_attn_implementation("eager")
            else:
                kw["output_attentions"] = False
            out = model.generate(**inputs, **kw)
            self.assertEqual(len(out.scores), self.max_new_tokens)
            self.assertEqual(len(out.logits), self.max_new_tokens)
            batch = out.sequences.shape[0]
            for s in out.scores:
                self.assertEqual(s.shape[0], batch)
                self.assertEqual(s.device.type, torch.device(torch_device).type)
            hidden = out.decoder_hidden_states if config.is_encoder_decoder else out.hidden_states
            self.assertEqual(len(hidden), self.max_new_tokens)
            if kw["output_attentions"]:
                attn = out.decoder_attentions if config.is_encoder_decoder else out.attentions
                self.assertEqual(len(attn), self.max_new_tokens)

    @pytest.mark.generate
    def test_left_padding_compatibility(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            if config.is_encoder_decoder or "input_ids" not in inputs:
                self.skipTest("left padding applies to decoder-only text models")
            _, model = self._pair(model_class, config)
            ids = inputs["input_ids"].to(torch_device)
            mask = torch.ones_like(ids)
            pad = config.pad_token_id if getattr(config, "pad_token_id", None) is not None else 0
            padded_ids = torch.cat([torch.full((ids.shape[0], 3), pad, dtype=ids.dtype, device=ids.device), ids], 1)
            padded_mask = torch.cat([torch.zeros_like(padded_ids[:, :3]), mask], 1)
            with torch.no_grad():
                plain = model(input_ids=ids, attention_mask=mask).logits[:, -1]
                padded = model(input_ids=padded_ids, attention_mask=padded_mask).logits[:, -1]
            torch.testing.assert_close(padded.cpu(), plain.cpu(), atol=1e-4, rtol=1e-4)

    @pytest.mark.generate
    def test_generate_from_inputs_embeds(self):
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            if config.is_encoder_decoder or "input_ids" not in inputs:
                self.skipTest("generation from inputs_embeds is for decoder-only text models")
            if "inputs_embeds" not in inspect.signature(model_class.forward).parameters:
                self.skipTest(f"{model_class.__name__} takes no inputs_embeds")
            _, model = self._pair(model_class, config)
            inputs = self._on(inputs, torch_device)
            kw = self._gen_kwargs(config, return_dict_in_generate=True, output_logits=True)
            from_ids = model.generate(**inputs, **kw)
            embeds = model.get_input_embeddings()(inputs["input_ids"])
            from_embeds = model.generate(inputs_embeds=embeds, attention_mask=inputs.get("attention_mask"), **kw)
            # From embeddings, only the new tokens are returned.
            self.assertEqual(from_embeds.sequences.shape[1], self.max_new_tokens)
            for step, (a, b) in enumerate(zip(from_embeds.logits, from_ids.logits)):
                torch.testing.assert_close(a.cpu(), b.cpu(), atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"step {step}: {m}")


def _cpu_view(out):
    """A generate() output with its logits on the CPU (the reference side of _assert_steps_match)."""
    out = copy.copy(out)
    out.sequences = out.sequences.cpu()
    out.logits = tuple(x.cpu() for x in out.logits)
    return out


# The mixin is collected only through model test classes.
assert not issubclass(GenerationTesterMixin, unittest.TestCase)
