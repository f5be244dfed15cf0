"""Ours: the sdist's test_configuration_common.py imports this module, which
the sdist does not carry. `config_common_kwargs` sets every attribute that
PreTrainedConfig itself owns to a value other than its default, so that
ConfigTester.check_config_arguments_init proves each one is stored."""

config_common_kwargs = {
    "architectures": ["BertModel"],
    "output_hidden_states": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "is_encoder_decoder": True,
    "id2label": {0: "label_a", 1: "label_b", 2: "label_c"},
    "label2id": {"label_a": 0, "label_b": 1, "label_c": 2},
    "problem_type": "regression",
}
