package mtpkit.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test

class EmbeddingsTest {
    @Test
    fun halfToFloatIsExactOnEveryClass() {
        val cases = mapOf(0x0000 to 0f, 0x3C00 to 1f, 0xC000 to -2f, 0x7BFF to 65504f, 0x0001 to 5.9604645e-8f,
            0x03FF to 6.097555e-5f, 0x0400 to 6.1035156e-5f, 0x3555 to 0.33325195f, 0x7C00 to Float.POSITIVE_INFINITY)
        for ((bits, want) in cases) assertEquals(want, Embeddings.halfToFloat(bits.toShort()), "0x%04x".format(bits))
        assert(Embeddings.halfToFloat(0x7E00.toShort()).isNaN())
    }
}
