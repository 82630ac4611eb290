package mtpkit.core

/** A toy language: the target's greedy next token after t is always next(t), whatever the context. */
const val VOCAB = 101

/** One cycle through all 101 ids, so a chain never repeats a token within the lengths tests use. */
fun next(t: Int) = (t + 17) % VOCAB

/** The target's greedy continuation of [start]: what every lossless run must produce. */
fun chain(start: Int, count: Int): List<Int> = generateSequence(next(start)) { next(it) }.take(count).toList()

fun oneHot(t: Int) = FloatArray(VOCAB).also { it[t] = 1f }

/** Records every call as (ids, pos) so tests can check where each verify ran (rollback = pos moving by n + 1). */
class FakeTarget : Target {
    val forwards = ArrayList<Pair<List<Int>, Int>>()
    override val calls get() = forwards.size

    override fun forward(ids: IntArray, pos: Int): TargetOutput {
        forwards.add(ids.toList() to pos)
        return TargetOutput(ids.map { oneHot(next(it)) }, ids.map { floatArrayOf(it.toFloat()) })
    }

    override fun drafterView(pos: Int): DrafterView = emptyMap()
}

/** Proposes next(token) for the first [correctSteps] steps of each round and a wrong token after that. */
class FakeDrafter(private val correctSteps: Int) : Drafter {
    override var calls = 0
    private var roundPos = -1
    private var step = 0

    override fun step(token: Int, activations: FloatArray, pos: Int, view: DrafterView): DraftOutput {
        calls++
        if (pos != roundPos) {
            roundPos = pos
            step = 0
        }
        val proposal = if (step++ < correctSteps) next(token) else (next(token) + 1) % VOCAB
        return DraftOutput(oneHot(proposal), activations)
    }
}
