#include "engine/tokenizer/chat_template.h"

#include <algorithm>

#include "engine/core/error.h"

namespace hg {
namespace {

constexpr const char* kLlama3Markers[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
constexpr const char* kChatmlMarkers[] = {"<|im_start|>", "<|im_end|>"};
// Llama-3.1's template writes this system turn when the conversation has none (its date_string default).
constexpr const char* kLlama31System = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
constexpr const char* kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr const char* kQwen2System = "You are a helpful assistant.";

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The family of a model's template text, with the system turn it writes by default.
bool recognise(const std::string& text, ChatTemplate* t) {
  if (has(text, "<|start_header_id|>")) {
    t->name = "llama3";
    t->system = has(text, "Cutting Knowledge Date") ? kLlama31System : "";
    return true;
  }
  if (has(text, "<|im_start|>")) {
    t->name = "chatml";
    t->system = has(text, kQwen25System) ? kQwen25System : has(text, kQwen2System) ? kQwen2System : "";
    return true;
  }
  return false;
}

int32_t marker(const Tokenizer& tok, const ChatTemplate& t, const char* m) {
  const int32_t id = tok.token_id(m);
  if (id < 0) input_error("chat template {}: the tokenizer has no {} token", t.name, m);
  return id;
}

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1));
}

void append(std::vector<int32_t>& to, const std::vector<int32_t>& v) { to.insert(to.end(), v.begin(), v.end()); }

}  // namespace

ChatTemplate resolve_chat_template(const Tokenizer& tok, const std::string& choice, const std::string& where) {
  ChatTemplate t;
  if (choice == "none") {
    t.source = "none requested";
    return t;
  }
  ChatTemplate own;
  const bool known = !tok.chat_template.empty() && recognise(tok.chat_template, &own);
  if (choice == "auto") {
    if (tok.chat_template.empty()) {
      t.source = "the model has none";
      return t;
    }
    if (!known) {
      std::string start = tok.chat_template.substr(0, 60);
      std::replace(start.begin(), start.end(), '\n', ' ');
      input_error("{}: the model's chat template is not one hgbench renders (it begins '{}'); choose {}", where,
                  start, kChatTemplateChoices);
    }
    t = own;
    t.source = "model";
  } else if (choice == "llama3" || choice == "chatml") {
    t.name = choice;
    t.source = "named";
    if (known && own.name == choice) t.system = own.system;  // the model's own variant of the family
  } else {
    input_error("{}: chat template '{}' (expected {})", where, choice, kChatTemplateChoices);
  }
  try {
    for (const char* m : t.name == "llama3" ? std::vector<const char*>(std::begin(kLlama3Markers), std::end(kLlama3Markers))
                                            : std::vector<const char*>(std::begin(kChatmlMarkers), std::end(kChatmlMarkers)))
      (void)marker(tok, t, m);
  } catch (const InputError& e) {
    input_error("{}: {}", where, e.what());
  }
  return t;
}

ChatPrompt encode_chat(const Tokenizer& tok, const ChatTemplate& t, std::string_view user) {
  ChatPrompt p;
  if (!t.applied()) {
    p.user = tok.encode(user);
    if (tok.add_bos && tok.bos_id >= 0) p.head.push_back(tok.bos_id);
    return p;
  }
  if (t.name == "llama3") {
    const int32_t bot = marker(tok, t, "<|begin_of_text|>"), sh = marker(tok, t, "<|start_header_id|>"),
                  eh = marker(tok, t, "<|end_header_id|>"), eot = marker(tok, t, "<|eot_id|>");
    auto header = [&](std::vector<int32_t>& to, const char* role) {
      to.push_back(sh);
      append(to, tok.encode(role));
      to.push_back(eh);
    };
    p.head.push_back(bot);
    if (!t.system.empty()) {
      header(p.head, "system");
      append(p.head, tok.encode("\n\n" + t.system));
      p.head.push_back(eot);
    }
    header(p.head, "user");
    append(p.head, tok.encode("\n\n"));
    p.user = tok.encode(trim(user));  // the template trims every message
    p.tail.push_back(eot);
    header(p.tail, "assistant");
    p.tail_text = "\n\n";
    return p;
  }
  const int32_t ims = marker(tok, t, "<|im_start|>"), ime = marker(tok, t, "<|im_end|>");
  if (!t.system.empty()) {
    p.head.push_back(ims);
    append(p.head, tok.encode("system\n" + t.system));
    p.head.push_back(ime);
    append(p.head, tok.encode("\n"));
  }
  p.head.push_back(ims);
  append(p.head, tok.encode("user\n"));
  p.user = tok.encode(user);
  p.tail.push_back(ime);
  append(p.tail, tok.encode("\n"));
  p.tail.push_back(ims);
  append(p.tail, tok.encode("assistant"));
  p.tail_text = "\n";
  return p;
}

std::vector<int32_t> encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& t, std::string_view user) {
  if (!t.applied()) return tok.encode_prompt(user);
  const ChatPrompt p = encode_chat(tok, t, user);
  std::vector<int32_t> out = p.head;
  append(out, p.user);
  append(out, p.tail);
  append(out, tok.encode(p.tail_text));
  return out;
}

}  // namespace hg
