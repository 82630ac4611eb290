package mtpkit.core

/**
 * A conversation whose KV cache outlives its turns: each turn prefills only what is new (mirrors
 * runtime/conversation.py). Core works on ids: [render] turns the history into the ids of the model's chat template
 * (the app's tokenizer and template), with the answers this conversation generated (kept: message index -> ids) as
 * the ids generated rather than their text re-tokenized; [decode] an answer's ids into text. The engine prefills
 * only the ids after the longest common prefix with what its cache holds (Engine.cachedPrefix): an edited or
 * regenerated turn rewinds to where the history first differs, the way a rejected draft rewinds, so every turn's
 * tokens are those a fresh prefill of the whole rendered conversation gives.
 */

/** Generated answers remembered as ids (a longer history renders the oldest as text). */
const val MAX_ANSWERS = 256

/** One message of the history; role: user, assistant or system. */
data class ChatMessage(val role: String, val content: String)

/** The next turn does not fit the export's KV capacity, even after dropping what dropOldest may drop. */
class ConversationFullError(message: String) : IllegalArgumentException(message)

/**
 * messages: the history, editable between turns; reply() answers its last user message and appends the answer.
 * dropOldest: drop whole oldest turns while the history does not fit; dropped counts them.
 */
class Conversation(
    val engine: Engine,
    private val render: (List<ChatMessage>, Map<Int, List<Int>>) -> IntArray,
    private val decode: (List<Int>) -> String,
    var dropOldest: Boolean = false,
) {
    val messages = ArrayList<ChatMessage>()
    var dropped = 0
        private set
    var promptIds = IntArray(0) // the latest turn's rendered history
        private set
    // generated answers' text -> their ids without the stop token; an edited answer's text is not here
    private val answers = LinkedHashMap<String, List<Int>>()

    /** Forget the history (the cache is overwritten from the first position by the next turn). */
    fun reset() = messages.clear()

    /** Add a user message and stream the answer (see reply). */
    fun send(text: String, cfg: GenConfig, stats: Stats = Stats()): Sequence<Emitted> {
        messages.add(ChatMessage("user", text))
        val prompt = try {
            fit(cfg)
        } catch (e: IllegalArgumentException) {
            messages.removeAt(messages.size - 1) // a turn that cannot run never happened
            throw e
        }
        return recorded(prompt, cfg, stats)
    }

    /**
     * Stream the assistant's answer to the history as it stands (a regenerated answer: drop the last assistant
     * message first); the answer is in messages from its first token on. Throws ConversationFullError (before
     * any token) when the turn cannot fit.
     */
    fun reply(cfg: GenConfig, stats: Stats = Stats()): Sequence<Emitted> = recorded(fit(cfg), cfg, stats)

    /** One turn from its rendered prompt ids: what follows the prefix the cache holds is prefilled, then decoded. */
    fun turn(promptIds: IntArray, cfg: GenConfig, stats: Stats = Stats()): Sequence<Emitted> {
        this.promptIds = promptIds
        return engine.generate(promptIds, cfg, stats, reuse = true)
    }

    /** The rendered history's ids, after dropping the oldest whole turns while it does not fit (dropOldest). */
    fun fit(cfg: GenConfig): IntArray {
        while (true) {
            val ids = render(messages.toList(), kept())
            val needed = ids.size + cfg.maxNewTokens
            if (needed <= engine.manifest.capacity) return ids.also { promptIds = it }
            if (!dropOldest || !dropOldestTurn()) throw ConversationFullError(fullMessage(needed, cfg, users().size < 2))
        }
    }

    /** The assistant messages whose text is an answer this conversation generated: index -> its ids. */
    fun kept(): Map<Int, List<Int>> = messages.indices
        .filter { messages[it].role == "assistant" && messages[it].content in answers }
        .associateWith { answers.getValue(messages[it].content) }

    /** Remove the first turn (a user message and what follows it up to the next one) unless it is the last. */
    private fun dropOldestTurn(): Boolean {
        val users = users()
        if (users.size < 2) return false
        messages.subList(users[0], users[1]).clear() // system messages before the first turn stay
        dropped++
        return true
    }

    private fun users() = messages.indices.filter { messages[it].role == "user" }

    private fun fullMessage(needed: Int, cfg: GenConfig, alone: Boolean): String {
        val room = "$needed positions with maxNewTokens ${cfg.maxNewTokens}, beyond the export's KV capacity of " +
            "${engine.manifest.capacity}"
        return if (alone) "the last message alone needs $room: shorten it, lower maxNewTokens or re-export with a " +
            "larger --max-cache-len"
        else "the conversation needs $room: drop the oldest turns (dropOldest = true) or start over (/reset, reset())"
    }

    /** The answer is kept in messages as far as it was read: a sequence the caller stops reading runs no finally. */
    private fun recorded(prompt: IntArray, cfg: GenConfig, stats: Stats): Sequence<Emitted> = sequence {
        val produced = ArrayList<Int>()
        for (emitted in turn(prompt, cfg, stats)) {
            produced.add(emitted.token)
            if (produced.size == 1) messages.add(ChatMessage("assistant", ""))
            val text = decode(produced)
            answers.remove(messages[messages.size - 1].content) // the answer so far, one token shorter
            answers[text] = if (emitted.token in engine.manifest.eosIds) produced.dropLast(1) else produced.toList()
            while (answers.size > MAX_ANSWERS) answers.remove(answers.keys.first())
            messages[messages.size - 1] = ChatMessage("assistant", text)
            yield(emitted)
        }
    }
}
