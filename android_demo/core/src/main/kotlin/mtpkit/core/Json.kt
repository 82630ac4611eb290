package mtpkit.core

/**
 * A minimal JSON reader for manifest.json and `mtpkit run --json` output.
 *
 * Core has no dependencies (org.json is Android-only, kotlinx.serialization needs a compiler plugin and Maven),
 * so this reads objects as Map<String, Any?>, arrays as List<Any?>, integers as Long and other numbers as Double.
 */
object Json {
    /** Parses [text]; throws IllegalArgumentException with the offset of the first error. */
    fun parse(text: String): Any? {
        val reader = Reader(text)
        val value = reader.value()
        reader.skipSpace()
        require(reader.at == text.length) { "trailing characters at offset ${reader.at}" }
        return value
    }

    private class Reader(val s: String) {
        var at = 0

        fun skipSpace() {
            while (at < s.length && s[at].isWhitespace()) at++
        }

        fun value(): Any? {
            skipSpace()
            require(at < s.length) { "unexpected end of JSON" }
            return when (s[at]) {
                '{' -> obj()
                '[' -> array()
                '"' -> string()
                't' -> literal("true", true)
                'f' -> literal("false", false)
                'n' -> literal("null", null)
                else -> number()
            }
        }

        private fun literal(word: String, value: Any?): Any? {
            require(s.startsWith(word, at)) { "unexpected character '${s[at]}' at offset $at" }
            at += word.length
            return value
        }

        private fun obj(): Map<String, Any?> {
            val out = LinkedHashMap<String, Any?>()
            at++
            skipSpace()
            if (s.getOrNull(at) == '}') return out.also { at++ }
            while (true) {
                skipSpace()
                require(s.getOrNull(at) == '"') { "expected a key at offset $at" }
                val key = string()
                skipSpace()
                expect(':')
                out[key] = value()
                skipSpace()
                if (s.getOrNull(at) == '}') return out.also { at++ }
                expect(',')
            }
        }

        private fun array(): List<Any?> {
            val out = ArrayList<Any?>()
            at++
            skipSpace()
            if (s.getOrNull(at) == ']') return out.also { at++ }
            while (true) {
                out.add(value())
                skipSpace()
                if (s.getOrNull(at) == ']') return out.also { at++ }
                expect(',')
            }
        }

        private fun expect(c: Char) {
            require(s.getOrNull(at) == c) { "expected '$c' at offset $at" }
            at++
        }

        private fun string(): String {
            val out = StringBuilder()
            at++
            while (true) {
                require(at < s.length) { "unterminated string" }
                val c = s[at++]
                when (c) {
                    '"' -> return out.toString()
                    '\\' -> out.append(escape())
                    else -> out.append(c)
                }
            }
        }

        private fun escape(): Char {
            val c = s[at++]
            return when (c) {
                'n' -> '\n'; 't' -> '\t'; 'r' -> '\r'; 'b' -> '\b'; 'f' -> '\u000c'
                'u' -> s.substring(at, at + 4).toInt(16).toChar().also { at += 4 }
                else -> c // \" \\ \/
            }
        }

        private fun number(): Any {
            val start = at
            while (at < s.length && (s[at].isDigit() || s[at] in "+-.eE")) at++
            val text = s.substring(start, at)
            require(text.isNotEmpty()) { "unexpected character '${s[start]}' at offset $start" }
            return text.toLongOrNull() ?: text.toDouble()
        }
    }
}
