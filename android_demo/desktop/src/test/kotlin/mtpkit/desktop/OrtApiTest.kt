package mtpkit.desktop

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test
import java.io.File
import java.util.concurrent.TimeUnit

/**
 * libonnxruntime stays loaded across garbage collection. Checked in a fresh JVM: in this one an earlier test's
 * CreateEnv has already made the library undeletable, which would hide the bug (a GC between OrtApi() and
 * createEnv() unmapped it, and the next call crashed in libffi).
 */
class OrtApiTest {
    @Test
    fun theLibrarySurvivesAGcBeforeTheFirstEnv() {
        val java = File(System.getProperty("java.home"), "bin/java").path
        // JUnit's console launcher loads the tests in its own class loader: the child's class path is where they came from
        val jars = listOf(GcProbe::class.java, OrtApi::class.java, com.sun.jna.Native::class.java, Unit::class.java)
            .map { File(it.protectionDomain.codeSource.location.toURI()).path }
        val cmd = listOf(java, "-Xmx48m", "-cp", jars.joinToString(File.pathSeparator), GcProbe::class.java.name,
            System.getProperty("mtpkit.ortLib") ?: error("set -Dmtpkit.ortLib (android_demo/test.sh does)"))
        val proc = ProcessBuilder(cmd).redirectErrorStream(true).start()
        val out = proc.inputStream.bufferedReader().readText()
        check(proc.waitFor(60, TimeUnit.SECONDS)) { "probe hung" }
        assertEquals("mapped after gc: true, env created: true", out.lines().firstOrNull { it.startsWith("mapped") }, out)
        assertEquals(0, proc.exitValue(), out)
    }
}

/** Child JVM of [OrtApiTest]: creates the API, forces collection, then uses it. */
object GcProbe {
    private fun mapped() = File("/proc/self/maps").readLines().any { "libonnxruntime" in it }

    @JvmStatic
    fun main(args: Array<String>) {
        val api = OrtApi(args[0])
        repeat(5) { System.gc(); Thread.sleep(100) } // JNA's cleaner thread runs between these
        val mapped = mapped()
        System.out.flush()
        println("mapped after gc: $mapped, env created: ${mapped && api.createEnv() != null}")
    }
}
