package mtpkit.demo

import android.app.Activity
import android.content.Intent
import android.net.Uri
import android.os.Bundle
import android.provider.DocumentsContract
import android.view.View
import android.widget.Button
import android.widget.CheckBox
import android.widget.EditText
import android.widget.RadioGroup
import android.widget.TextView
import kotlinx.coroutines.runBlocking
import mtpkit.core.ChatMessage
import mtpkit.core.GenConfig
import mtpkit.core.Stats
import java.io.File
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.concurrent.thread

/**
 * One screen, a chat: the history, a message box, backend (ONNX export through core's loop, or model.litertlm
 * through LiteRT-LM), drafter on/off, the answer streamed into the history and live stats. Reset (or typing
 * /reset) clears the history. Models come from `adb push DIR <external files>/model` or a folder picked from
 * storage (copied into app storage, since both runtimes need file paths).
 */
class MainActivity : Activity() {
    private val modelDir by lazy { File(getExternalFilesDir(null), "model") }
    private var onnx: OnnxRunner? = null
    private var litertlm: LiteRtLmRunner? = null
    private val busy = AtomicBoolean(false) // one turn at a time: both runtimes keep one conversation
    private val transcript = ArrayList<ChatMessage>() // what the screen shows; each runner keeps its own history
    private var transcriptOnnx: Boolean? = null // the backend the history on screen belongs to

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        view<TextView>(R.id.model).text = getString(R.string.model_hint) + "\nusing: $modelDir"
        view<Button>(R.id.pick).setOnClickListener {
            startActivityForResult(Intent(Intent.ACTION_OPEN_DOCUMENT_TREE), PICK_FOLDER)
        }
        view<Button>(R.id.send).setOnClickListener { send() }
        view<Button>(R.id.reset).setOnClickListener { reset("history cleared") }
    }

    @Deprecated("framework Activity API; no androidx dependency in this demo")
    override fun onActivityResult(requestCode: Int, resultCode: Int, data: Intent?) {
        super.onActivityResult(requestCode, resultCode, data)
        val tree = data?.data ?: return
        if (requestCode != PICK_FOLDER || resultCode != RESULT_OK) return
        status("copying model files...")
        thread { copyTree(tree); closeRunners(); runOnUiThread { reset("copied into $modelDir") } }
    }

    private fun send() {
        val box = view<EditText>(R.id.prompt)
        val text = box.text.toString()
        if (busy.get()) return status("wait for the answer to finish")
        if (text.trim() == "/reset") return reset("history cleared").also { box.setText("") }
        if (text.isBlank()) return
        val speculative = view<CheckBox>(R.id.speculative).isChecked
        val useOnnx = view<RadioGroup>(R.id.backend).checkedRadioButtonId == R.id.backend_onnx
        // each backend keeps its own history, and LiteRT-LM fixes speculation per conversation
        if (transcriptOnnx != null && transcriptOnnx != useOnnx) reset("backend changed: a new conversation")
        if (!useOnnx && litertlm?.startsOver(speculative) == true) reset("drafter toggled: a new LiteRT-LM conversation")
        busy.set(true)
        box.setText("")
        transcriptOnnx = useOnnx
        transcript.add(ChatMessage("user", text))
        transcript.add(ChatMessage("assistant", ""))
        showTranscript()
        thread { turn(text, speculative, useOnnx) }
    }

    private fun turn(text: String, speculative: Boolean, useOnnx: Boolean) {
        try {
            if (useOnnx) sendOnnx(text, speculative) else sendLiteRtLm(text, speculative)
        } catch (e: Exception) {
            runOnUiThread { // a turn that produced nothing leaves no trace in the history on screen
                if (transcript.lastOrNull()?.content == "") repeat(2) { transcript.removeAt(transcript.size - 1) }
                showTranscript()
            }
            status("error: ${e.message}")
        } finally {
            busy.set(false)
        }
    }

    /** Clears the history on screen and in both runners (their caches are overwritten by the next turn). */
    private fun reset(message: String) {
        if (busy.get()) return status("wait for the answer to finish")
        onnx?.reset()
        litertlm?.reset()
        transcript.clear()
        transcriptOnnx = null
        view<TextView>(R.id.output).text = ""
        status(message)
    }

    private fun sendOnnx(text: String, speculative: Boolean) {
        val runner = onnx ?: OnnxRunner(modelDir).also { onnx = it }
        val stats = Stats()
        runner.send(text, GenConfig(maxNewTokens = 128, mtp = speculative), stats) { answer -> showAnswer(answer, onnxStats(stats)) }
        val dropped = runner.conversation.dropped
        if (dropped > 0) status(onnxStats(stats) + "\n$dropped oldest turns dropped so far to fit the KV cache")
    }

    private fun onnxStats(s: Stats): String {
        val byPosition = s.acceptanceByPosition.joinToString(" ") { "%.0f%%".format(100 * it) }
        return ("%d tokens, %.1f tok/s, drafter ran: %s (%d calls)\naccepted %d/%d (%s), by position [%s]\n" +
            "%.2f tokens per target call; prompt %d tokens, %d of them cached from earlier turns")
            .format(s.newTokens, s.tokensPerSecond ?: 0.0, if (s.drafterRan) "yes" else "NO", s.drafterCalls,
                s.accepted, s.drafted, s.acceptanceRate?.let { "%.0f%%".format(100 * it) } ?: "-", byPosition,
                s.tokensPerTargetCall ?: 0.0, s.promptTokens, s.cachedTokens)
    }

    private fun sendLiteRtLm(text: String, speculative: Boolean) {
        val file = modelDir.listFiles()?.firstOrNull { it.name.endsWith(".litertlm") }
            ?: error("no .litertlm file in $modelDir")
        val runner = litertlm ?: LiteRtLmRunner(file.path).also { litertlm = it }
        val header = "drafter in bundle: ${if (runner.hasDrafter) "yes" else "NO"}, speculation requested: $speculative"
        val info = runBlocking { runner.send(text, speculative) { answer -> showAnswer(answer, header) } }
        status("$header\ndecode %.1f tok/s (%d tokens), ttft %.2f s; toggle the drafter and compare"
            .format(info.lastDecodeTokensPerSecond, info.lastDecodeTokenCount, info.timeToFirstTokenInSecond))
    }

    /** Copies the picked folder's files into modelDir (flat: an export folder has no subfolders). */
    private fun copyTree(tree: Uri) {
        modelDir.mkdirs()
        val children = DocumentsContract.buildChildDocumentsUriUsingTree(tree, DocumentsContract.getTreeDocumentId(tree))
        val columns = arrayOf(DocumentsContract.Document.COLUMN_DOCUMENT_ID, DocumentsContract.Document.COLUMN_DISPLAY_NAME)
        contentResolver.query(children, columns, null, null, null)?.use { c ->
            while (c.moveToNext()) {
                val uri = DocumentsContract.buildDocumentUriUsingTree(tree, c.getString(0))
                contentResolver.openInputStream(uri)?.use { input ->
                    File(modelDir, c.getString(1)).outputStream().use { input.copyTo(it) }
                }
            }
        }
    }

    private fun closeRunners() {
        onnx?.close().also { onnx = null }
        litertlm?.close().also { litertlm = null }
    }

    /** The answer so far replaces the last message of the history on screen. */
    private fun showAnswer(answer: String, stats: String) = runOnUiThread {
        transcript[transcript.size - 1] = ChatMessage("assistant", answer)
        showTranscript()
        view<TextView>(R.id.stats).text = stats
    }

    private fun showTranscript() {
        view<TextView>(R.id.output).text = transcript.joinToString("\n\n") { (if (it.role == "user") "> " else "") + it.content }
    }

    private fun status(message: String) = runOnUiThread { view<TextView>(R.id.stats).text = message }

    /** findViewById with the cast written out: its generic form is API 26, and test.sh compiles against API 23. */
    private inline fun <reified T : View> view(id: Int): T = findViewById(id) as T

    override fun onDestroy() {
        closeRunners()
        super.onDestroy()
    }

    private companion object {
        const val PICK_FOLDER = 1
    }
}
