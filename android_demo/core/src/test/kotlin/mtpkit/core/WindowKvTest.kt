package mtpkit.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Test
import java.io.File

/** Two KV layers: 0 sliding (window W = 3, 2 heads, head_dim 2), 1 full (1 head, head_dim 3). */
fun tinyManifest(capacity: Int = 16) = ModelManifest(
    root = File("."), vocabSize = VOCAB, hiddenSize = 1, eosIds = emptySet(), numAssistantTokens = 4,
    schedule = "constant", capacity = capacity,
    kvLayers = listOf(KvLayer(0, "sliding_attention", 2, 2), KvLayer(1, "full_attention", 1, 3)),
    drafterLayers = mapOf("sliding_attention" to 0, "full_attention" to 1),
    slidingPast = 2, drafterSlidingVisible = 4,
    onnx = OnnxBackend(emptyMap(), emptyMap(), EmbeddingTable("embeddings.bin", 0, VOCAB, 1, 1f)),
    tokenizerSha256 = "", // no files behind this manifest: never verified
)

class WindowKvTest {
    /** A [1, h, T, d] tensor whose every element says where it belongs: marker + 100 * head + position. */
    private fun entries(heads: Int, dim: Int, pos: Int, count: Int, marker: Int): Tensor {
        val data = FloatArray(heads * count * dim) { i -> (marker + 100 * (i / (count * dim)) + pos + (i / dim) % count).toFloat() }
        return Tensor.of(longArrayOf(1, heads.toLong(), count.toLong(), dim.toLong()), data)
    }

    /** What a [1, h, P, d] window holds for [head], one marker value per position. */
    private fun held(t: Tensor, head: Int): List<Int> {
        val (count, dim) = t.shape[2].toInt() to t.shape[3].toInt()
        return (0 until count).map { t.floats!![(head * count + it) * dim].toInt() }
    }

    @Test
    fun pastWindowsAndRollbackByPosition() {
        val kv = WindowKv(tinyManifest())
        kv.write(0, 0, entries(2, 2, 0, 6, 0), entries(2, 2, 0, 6, 2000))
        kv.write(1, 0, entries(1, 3, 0, 6, 0), entries(1, 3, 0, 6, 2000))
        // a verify wrote positions 4..5, both rejected: pos rewinds to 4 and the next call overwrites them
        kv.write(1, 4, entries(1, 3, 4, 2, 1000), entries(1, 3, 4, 2, 3000))
        val (fullK, fullV) = kv.past(1, 6)
        assertEquals(listOf(0, 1, 2, 3, 1004, 1005), held(fullK, 0))
        assertEquals(listOf(2000, 2001, 2002, 2003, 3004, 3005), held(fullV, 0))
        val (slidingK, slidingV) = kv.past(0, 6) // sliding: only the last W-1 = 2 positions
        assertEquals(listOf(104, 105), held(slidingK, 1))
        assertEquals(listOf(2004, 2005), held(slidingV, 0))
        assertEquals(0L, kv.past(1, 0).first.shape[2]) // prefill reads an empty window
    }

    @Test
    fun drafterSeesOnlyCommittedPositions() {
        val kv = WindowKv(tinyManifest())
        kv.write(0, 0, entries(2, 2, 0, 8, 0), entries(2, 2, 0, 8, 0))
        kv.write(1, 0, entries(1, 3, 0, 8, 0), entries(1, 3, 0, 8, 0))
        val view = kv.drafterView(7) // drafting for the token at 7: positions < 7
        assertEquals((0 until 7).toList(), held(view.getValue("full_attention").first, 0))
        assertEquals(listOf(103, 104, 105, 106), held(view.getValue("sliding_attention").second, 1)) // last W+1
    }

    @Test
    fun aRingReadsWhatAFullBufferReadsThroughRewindsAndGrowth() {
        val kv = WindowKv(tinyManifest(capacity = 200)) // a ring of W + 1 + VERIFY_ROOM = 21 slots to begin with
        val rng = java.util.Random(0)
        kv.keepFrom(40)
        kv.write(0, 0, entries(2, 2, 0, 40, 0), entries(2, 2, 0, 40, 2000)) // a prompt longer than the ring
        assertEquals(21, kv.slidingSlots())
        var pos = 40
        repeat(20) {
            val count = 1 + rng.nextInt(6)
            kv.write(0, pos, entries(2, 2, pos, count, 0), entries(2, 2, pos, count, 2000))
            pos += 1 + rng.nextInt(count) // accepted drafts, then a rewind of the rest
            val (k, v) = kv.past(0, pos) // the last W-1 = 2 positions
            assertEquals(listOf(100 + pos - 2, 100 + pos - 1), held(k, 1))
            assertEquals(listOf(2000 + pos - 2, 2000 + pos - 1), held(v, 0))
            val view = kv.drafterView(pos).getValue("sliding_attention").first // the last W+1 = 4
            assertEquals((pos - 4 until pos).toList(), held(view, 0))
            assertEquals(true, kv.resumable(40))
        }
        assertEquals(true, kv.slidingSlots() < 200) // the answer and its window, not the capacity
        assertEquals(false, kv.resumable(30)) // the prompt's middle is gone: a turn that differs there prefills again
    }

    @Test
    fun refusesToWritePastCapacity() {
        val kv = WindowKv(tinyManifest(capacity = 8))
        kv.checkRoom(4, 4)
        val e = assertThrows(IllegalStateException::class.java) { kv.checkRoom(5, 4) }
        assertEquals(true, "capacity is 8" in e.message!!)
    }

    @Test
    fun jsonReadsWhatManifestsContain() {
        val d = Json.parse("""{"a": [1, -2.5e1, "x\"\u00e9\n"], "b": {"c": null, "d": true}}""") as Map<*, *>
        assertEquals(listOf(1L, -25.0, "x\"é\n"), d["a"])
        assertEquals(mapOf("c" to null, "d" to true), d["b"])
        assertThrows(IllegalArgumentException::class.java) { Json.parse("{\"a\": 1,}") }
        assertArrayEquals(floatArrayOf(2f), Tensor.of(longArrayOf(1, 2, 1), floatArrayOf(1f, 2f)).row(1))
    }
}
