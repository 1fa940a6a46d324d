// Chat templates of the common model families, applied as their Jinja templates render one user
// turn and the assistant's generation prompt: Llama-3 (with Llama-3.1's dated system header when
// the model's template has one) and ChatML (Qwen2 and Qwen2.5, with their default system
// message). A model's own template text is recognised by its markers; hgbench renders no Jinja.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace hg {

struct ChatTemplate {
  std::string name = "none";  // none, llama3, chatml
  std::string source;         // "model" (recognised in the model's template), "named", "none requested",
                              // "the model has none"
  std::string system;         // the system turn's text the template always writes ("" : no system turn)
  bool applied() const { return name != "none"; }
};

// The template `choice` asks for: none, auto (the model's own: recognised, or an InputError naming
// what it starts with; none when the model gives no template) or a name (llama3, chatml). Every
// marker the template writes must be a control or added token of `tok`, else an InputError naming it.
ChatTemplate resolve_chat_template(const Tokenizer& tok, const std::string& choice, const std::string& where);
// The names `choice` may take, for messages and --help.
inline constexpr const char* kChatTemplateChoices = "none, auto, llama3 or chatml";

// One user turn and the assistant's generation prompt as token ids, split where a caller inserts
// tokens of its own: `head` (BOS, the system turn, the user header) before the user's text, the
// user's text, then `tail` (the end of the turn and the assistant's header) and `tail_text`, the
// whitespace after that header, not encoded: a scorer joins it to the continuation as lm-eval does
// (a context's trailing whitespace moves into the continuation). Each text piece between markers
// is encoded on its own (the families' pre-tokenizers split at those boundaries anyway).
struct ChatPrompt {
  std::vector<int32_t> head;
  std::vector<int32_t> user;
  std::vector<int32_t> tail;
  std::string tail_text;
};
ChatPrompt encode_chat(const Tokenizer& tok, const ChatTemplate& t, std::string_view user);
// head + user + tail + tail_text's tokens, or the tokenizer's own prompt (BOS when add_bos, then the
// text) for none.
std::vector<int32_t> encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& t, std::string_view user);

}  // namespace hg
